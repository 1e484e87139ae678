"""tierlink.models: the framework's model layer, below every tool that uses a model.

One card for every model (:mod:`.card`), one tensor declaration (:mod:`.tensors`), the
task declaration and its output kinds (:mod:`.task`, :mod:`.kinds`), one calibration
module (:mod:`.calibration`), one evaluation module (:mod:`.evaluate`), one labelled-data
type (:mod:`.data`), one on-disk layout (:mod:`.layout`), the catalog that resolves model
names from registered sources (:mod:`.catalog`), runtimes through one registry
(:mod:`.runtimes`: ONNX Runtime in :mod:`.onnx`, a multi-exit model in :mod:`.exits`, a
user's Python model in :mod:`.python`) and the home directory (:mod:`.home`). numpy and ONNX Runtime only: no torch, no web framework. The
demo's zoo, the model store, quantisation, cascades, split computing and the nodes all build
on these; nothing here imports them.

Importing this package is cheap: it imports none of its modules.
"""
