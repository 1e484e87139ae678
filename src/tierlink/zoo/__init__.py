"""tierlink.zoo: real Fashion-MNIST models for demos, tests and benchmarks.

Three variants of one task, one per tier: ``fmnist-small`` (device), ``fmnist-medium``
(edge), ``fmnist-large`` (cloud), trained reproducibly from the Debian package
``dataset-fashion-mnist``, exported to ONNX and described by a model card::

    zoo = ensure_zoo()                      # builds once (minutes), then cached
    session = ort_session(zoo.path("fmnist-small"))
    view = zoo.card("fmnist-small").as_model_view()

Importing this package is cheap: no torch, numpy or onnxruntime until used (the dataset and
evaluation helpers load lazily on first access).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tierlink.zoo.cache import Zoo, ensure_zoo, load_zoo, tierlink_home, zoo_dir
from tierlink.zoo.cards import ModelCard, TensorInfo, TrainingInfo, load_card, save_card
from tierlink.zoo.profiles import PROFILES, BuildProfile, TrainRecipe, model_names

if TYPE_CHECKING:
    from tierlink.zoo.datasets import CLASS_NAMES, Split, Splits, fashion_mnist
    from tierlink.zoo.evaluate import (
        accuracy,
        cascade_curve,
        measure_latency,
        onnx_logits,
        ort_session,
        softmax,
    )

_LAZY = {
    "CLASS_NAMES": "tierlink.zoo.datasets", "Split": "tierlink.zoo.datasets",
    "Splits": "tierlink.zoo.datasets", "fashion_mnist": "tierlink.zoo.datasets",
    "accuracy": "tierlink.zoo.evaluate", "cascade_curve": "tierlink.zoo.evaluate",
    "measure_latency": "tierlink.zoo.evaluate", "onnx_logits": "tierlink.zoo.evaluate",
    "ort_session": "tierlink.zoo.evaluate", "softmax": "tierlink.zoo.evaluate",
}

__all__ = [
    "CLASS_NAMES", "PROFILES", "BuildProfile", "ModelCard", "Split", "Splits", "TensorInfo",
    "TrainRecipe", "TrainingInfo", "Zoo", "accuracy", "cascade_curve", "ensure_zoo",
    "fashion_mnist", "load_card", "load_zoo", "measure_latency", "model_names", "onnx_logits",
    "ort_session", "save_card", "softmax", "tierlink_home", "zoo_dir",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tierlink.zoo' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
