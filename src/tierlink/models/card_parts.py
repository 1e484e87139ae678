"""The parts a model card is made of, each with its JSON form: where the model comes from
(:class:`TrainingInfo` for a model trained here, :class:`DataInfo` for one measured on a
user's data, :class:`Lineage` for a derived variant), how well its confidence is calibrated
(:class:`Calibration`) and its cascade curve. Pure data; the card itself is
:mod:`tierlink.models.card`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tierlink.core.types import CascadePoint
from tierlink.models.tensors import TensorDecl


@dataclass(frozen=True, slots=True)
class TrainingInfo:
    """How the weights were produced. ``train_samples``: images seen per epoch;
    ``calib_samples`` / ``test_samples``: how many images the accuracies were measured on
    (the ``test`` profile evaluates on a prefix of each split to stay fast); ``recipe``:
    the fingerprint of architecture + recipe + profile (a changed recipe means rebuild)."""

    epochs: int
    seed: int
    seconds: float
    profile: str
    torch_version: str
    train_samples: int = 0
    calib_samples: int = 0
    test_samples: int = 0
    recipe: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "seed": self.seed, "seconds": self.seconds,
                "profile": self.profile, "torch_version": self.torch_version,
                "train_samples": self.train_samples, "calib_samples": self.calib_samples,
                "test_samples": self.test_samples, "recipe": self.recipe}


def training_from_dict(data: Mapping[str, Any]) -> TrainingInfo:
    return TrainingInfo(
        epochs=int(data["epochs"]), seed=int(data["seed"]), seconds=float(data["seconds"]),
        profile=str(data["profile"]), torch_version=str(data["torch_version"]),
        train_samples=int(data.get("train_samples", 0)),
        calib_samples=int(data.get("calib_samples", 0)),
        test_samples=int(data.get("test_samples", 0)), recipe=str(data.get("recipe", "")))


@dataclass(frozen=True, slots=True)
class DataInfo:
    """The labelled data a user's model was measured on: its digest (the store keeps the
    data under it), where it was read from, and the seeded calibration/evaluation split."""

    sha256: str
    source: str
    seed: int
    calib_share: float
    calib_samples: int
    eval_samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "source": self.source, "seed": self.seed,
                "calib_share": self.calib_share, "calib_samples": self.calib_samples,
                "eval_samples": self.eval_samples}


def data_from_dict(data: Mapping[str, Any]) -> DataInfo:
    return DataInfo(str(data["sha256"]), str(data["source"]), int(data["seed"]),
                    float(data["calib_share"]), int(data["calib_samples"]),
                    int(data["eval_samples"]))


@dataclass(frozen=True, slots=True)
class Calibration:
    """Temperature scaling fitted on the calibration split (never the test split).

    ``ece_*``: expected calibration error (15 equal-width confidence bins) and ``nll_*``:
    the fit's loss (softmax NLL, or BCE for a multilabel model), on the calibration split
    before and after scaling, and on the test split after it (``test_ece``, a held-out check
    of the fit). A figure a model's kind cannot give is NaN (``null`` in JSON)."""

    temperature: float
    ece_before: float
    ece_after: float
    nll_before: float
    nll_after: float
    test_ece_before: float
    test_ece_after: float
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "ece_before": _out(self.ece_before),
                "ece_after": _out(self.ece_after), "nll_before": _out(self.nll_before),
                "nll_after": _out(self.nll_after),
                "test_ece_before": _out(self.test_ece_before),
                "test_ece_after": _out(self.test_ece_after), "samples": self.samples}


def calibration_from_dict(data: Mapping[str, Any]) -> Calibration:
    """The inverse of ``Calibration.to_dict``."""
    return Calibration(float(data["temperature"]), _in(data.get("ece_before")),
                       _in(data.get("ece_after")), _in(data.get("nll_before")),
                       _in(data.get("nll_after")), _in(data.get("test_ece_before")),
                       _in(data.get("test_ece_after")), int(data["samples"]))


def _out(x: float) -> float | None:
    return None if math.isnan(x) else x  # JSON has no NaN


def _in(x: Any) -> float:
    return math.nan if x is None else float(x)


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a derived variant (quantized, mixed precision) comes from.

    ``parent``: the full-precision model's name; ``parent_sha256``: the parent file it was
    made from (a rebuilt parent makes the variant stale); ``precision``: e.g. ``int8-static``;
    ``agreement``: top-1 agreement with the parent on the test split; ``accuracy_delta``:
    test accuracy minus the parent's (negative = worse); ``speedup``: parent latency /
    variant latency measured side by side (batch 1 and batch 32 per sample);
    ``settings``: how it was made (method, calibration, excluded layers...); ``verdict``:
    the variant's own judgement where it makes one (kept, or why not)."""

    parent: str
    parent_sha256: str
    precision: str
    agreement: float
    accuracy_delta: float
    speedup: Mapping[str, float]
    settings: Mapping[str, Any]
    verdict: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = {"parent": self.parent, "parent_sha256": self.parent_sha256,
               "precision": self.precision, "agreement": self.agreement,
               "accuracy_delta": self.accuracy_delta, "speedup": dict(self.speedup),
               "settings": dict(self.settings)}
        return out | ({"verdict": self.verdict} if self.verdict else {})


def lineage_from_dict(data: Mapping[str, Any] | None) -> Lineage | None:
    if data is None:
        return None
    return Lineage(parent=str(data["parent"]), parent_sha256=str(data["parent_sha256"]),
                   precision=str(data["precision"]), agreement=float(data["agreement"]),
                   accuracy_delta=float(data["accuracy_delta"]),
                   speedup=MappingProxyType({k: float(v) for k, v in data["speedup"].items()}),
                   settings=MappingProxyType(dict(data["settings"])),
                   verdict=str(data.get("verdict") or ""))


def cascade_from_dicts(points: Any) -> tuple[CascadePoint, ...]:
    """Cascade points from their JSON form (threshold, answered_share, answered_accuracy)."""
    return tuple(CascadePoint(float(p["threshold"]), float(p["answered_share"]),
                              float(p["answered_accuracy"])) for p in points)


def cascade_to_dicts(points: tuple[CascadePoint, ...]) -> list[dict[str, float]]:
    return [{"threshold": p.threshold, "answered_share": p.answered_share,
             "answered_accuracy": p.answered_accuracy} for p in points]


def tensor_from_dict(data: Mapping[str, Any]) -> TensorDecl:
    return TensorDecl(str(data["name"]), str(data["datatype"]),
                      tuple(int(d) for d in data["shape"]))
