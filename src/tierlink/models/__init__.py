"""tierlink.models: the framework's model layer, below every tool that uses a model.

One card for every model (:mod:`.card`), one tensor declaration (:mod:`.tensors`), one
calibration module (:mod:`.calibration`), one evaluation module (:mod:`.evaluate`), one
labelled-data type (:mod:`.data`), ONNX Runtime sessions (:mod:`.onnx`) and the home
directory (:mod:`.home`). numpy and ONNX Runtime only: no torch, no web framework. The
demo's zoo, the model store, quantisation, cascades, split computing and the nodes all build
on these; nothing here imports them.

Importing this package is cheap: it imports none of its modules.
"""
