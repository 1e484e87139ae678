"""Model cards: the JSON written beside every model file.

A card says what the model is (task, variant, tier, signature, labels), how good it is
(test and calibration accuracy, the cascade curve on the calibration split), how fast it
ran when built (ONNX Runtime, one thread) and how it was trained. Nodes read it to describe
the model to policies (:meth:`ModelCard.as_model_view`); the zoo cache reads its ``sha256``
to tell whether the ``.onnx`` beside it is the one that was measured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tierlink.core.types import CascadePoint, ModelView
from tierlink.durable import read_json, write_json  # write_json: card writers use it from here
from tierlink.errors import ModelError
from tierlink.models.tensors import TensorDecl

LATENCY_KEYS = ("batch1_p50", "batch1_p95", "batch32_per_sample")
TIERS = ("device", "edge", "cloud")
_REQUIRED = ("task", "name", "variant", "version", "tier", "params", "size_bytes", "sha256",
             "input", "output", "labels", "test_accuracy", "calib_accuracy", "latency_ms",
             "cascade", "temperature", "training")
_TRAINING_REQUIRED = ("epochs", "seed", "seconds", "profile", "torch_version")


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


@dataclass(frozen=True, slots=True)
class Calibration:
    """Temperature scaling fitted on the calibration split (never the test split).

    ``ece_*``: expected calibration error (15 equal-width confidence bins) and ``nll_*``:
    mean negative log-likelihood, on the calibration split before and after scaling, and on
    the test split after it (``test_ece``, a held-out check of the fit)."""

    temperature: float
    ece_before: float
    ece_after: float
    nll_before: float
    nll_after: float
    test_ece_before: float
    test_ece_after: float
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "ece_before": self.ece_before,
                "ece_after": self.ece_after, "nll_before": self.nll_before,
                "nll_after": self.nll_after, "test_ece_before": self.test_ece_before,
                "test_ece_after": self.test_ece_after, "samples": self.samples}


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a derived variant (quantized, mixed precision) comes from.

    ``parent``: the full-precision model's name; ``parent_sha256``: the parent file it was
    made from (a rebuilt parent makes the variant stale); ``precision``: e.g. ``int8-static``;
    ``agreement``: top-1 agreement with the parent on the test split; ``accuracy_delta``:
    test accuracy minus the parent's (negative = worse); ``speedup``: parent latency /
    variant latency measured side by side (batch 1 and batch 32 per sample);
    ``settings``: how it was made (method, calibration, excluded layers...)."""

    parent: str
    parent_sha256: str
    precision: str
    agreement: float
    accuracy_delta: float
    speedup: Mapping[str, float]
    settings: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"parent": self.parent, "parent_sha256": self.parent_sha256,
                "precision": self.precision, "agreement": self.agreement,
                "accuracy_delta": self.accuracy_delta, "speedup": dict(self.speedup),
                "settings": dict(self.settings)}


@dataclass(frozen=True, slots=True)
class ModelCard:
    """Everything known about one built model variant (see the module docstring).

    ``latency_ms`` maps ``batch1_p50``, ``batch1_p95`` (one image per call) and
    ``batch32_per_sample`` to milliseconds, measured with ONNX Runtime on one intra-op
    thread without spinning, on the machine that built the zoo.
    """

    task: str
    name: str
    variant: str
    version: str
    tier: str
    params: int
    size_bytes: int
    sha256: str
    input: TensorDecl
    output: TensorDecl
    labels: tuple[str, ...]
    test_accuracy: float
    calib_accuracy: float
    latency_ms: Mapping[str, float]
    cascade: tuple[CascadePoint, ...]
    temperature: float
    training: TrainingInfo
    precision: str = "fp32"
    calibration: Calibration | None = None
    lineage: Lineage | None = None  # None for a trained (full-precision) model

    @property
    def parent(self) -> str:
        """The full-precision model this one derives from (itself when it is one)."""
        return self.lineage.parent if self.lineage else self.name

    def as_model_view(self, latency_ms: float | None = None) -> ModelView:
        """The policy's view of this model; ``latency_ms`` overrides the card's batch-1 p50
        (a node passes what it measured itself)."""
        latency = self.latency_ms["batch1_p50"] if latency_ms is None else latency_ms
        return ModelView(name=self.name, task=self.task, version=self.version,
                         accuracy=self.test_accuracy, latency_ms=float(latency),
                         cascade=self.cascade)

    def to_dict(self) -> dict[str, Any]:
        """The card as JSON-ready data (the inverse of :func:`card_from_dict`)."""
        return {
            "task": self.task, "name": self.name, "variant": self.variant,
            "version": self.version, "tier": self.tier, "params": self.params,
            "size_bytes": self.size_bytes, "sha256": self.sha256,
            "input": self.input.to_dict(), "output": self.output.to_dict(),
            "labels": list(self.labels), "test_accuracy": self.test_accuracy,
            "calib_accuracy": self.calib_accuracy, "latency_ms": dict(self.latency_ms),
            "cascade": [{"threshold": p.threshold, "answered_share": p.answered_share,
                         "answered_accuracy": p.answered_accuracy} for p in self.cascade],
            "temperature": self.temperature, "training": self.training.to_dict(),
            "precision": self.precision,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "lineage": self.lineage.to_dict() if self.lineage else None,
        }


def card_from_dict(data: Mapping[str, Any], source: str = "model card") -> ModelCard:
    """Validate and convert parsed JSON; a missing or malformed field is a ``ModelError``
    naming the field."""
    if not isinstance(data, Mapping):
        raise ModelError(f"{source} is not a JSON object")
    _require(data, _REQUIRED, source)
    _require(data["training"], _TRAINING_REQUIRED, f"{source} field 'training'")
    _require(data["latency_ms"], LATENCY_KEYS, f"{source} field 'latency_ms'")
    try:
        card = _convert(data)
    except (TypeError, ValueError, KeyError) as exc:
        raise ModelError(f"{source} has a malformed field: {exc!r}") from exc
    if card.tier not in TIERS:
        raise ModelError(f"{source} field 'tier' is {card.tier!r}; expected one of {TIERS}")
    return card


def _require(data: Any, keys: tuple[str, ...], source: str) -> None:
    if not isinstance(data, Mapping):
        raise ModelError(f"{source} is not a JSON object")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ModelError(f"{source} lacks field(s) {', '.join(map(repr, missing))}")


def _convert(data: Mapping[str, Any]) -> ModelCard:
    return ModelCard(
        task=str(data["task"]), name=str(data["name"]), variant=str(data["variant"]),
        version=str(data["version"]), tier=str(data["tier"]), params=int(data["params"]),
        size_bytes=int(data["size_bytes"]), sha256=str(data["sha256"]),
        input=_tensor(data["input"]), output=_tensor(data["output"]),
        labels=tuple(str(x) for x in data["labels"]),
        test_accuracy=float(data["test_accuracy"]),
        calib_accuracy=float(data["calib_accuracy"]),
        latency_ms=MappingProxyType({k: float(data["latency_ms"][k]) for k in LATENCY_KEYS}),
        cascade=cascade_from_dicts(data["cascade"]),
        temperature=float(data["temperature"]),
        training=_training(data["training"]),
        precision=str(data.get("precision", "fp32")),
        calibration=_calibration(data.get("calibration")),
        lineage=_lineage(data.get("lineage")),
    )


def _calibration(data: Mapping[str, Any] | None) -> Calibration | None:
    return None if data is None else calibration_from_dict(data)


def calibration_from_dict(data: Mapping[str, Any]) -> Calibration:
    """The inverse of ``Calibration.to_dict``."""
    f = {k: float(data[k]) for k in (x.name for x in fields(Calibration)) if k != "samples"}
    return Calibration(f["temperature"], f["ece_before"], f["ece_after"], f["nll_before"],
                       f["nll_after"], f["test_ece_before"], f["test_ece_after"],
                       int(data["samples"]))


def cascade_from_dicts(points: Any) -> tuple[CascadePoint, ...]:
    """Cascade points from their JSON form (threshold, answered_share, answered_accuracy)."""
    return tuple(CascadePoint(float(p["threshold"]), float(p["answered_share"]),
                              float(p["answered_accuracy"])) for p in points)


def _lineage(data: Mapping[str, Any] | None) -> Lineage | None:
    if data is None:
        return None
    return Lineage(parent=str(data["parent"]), parent_sha256=str(data["parent_sha256"]),
                   precision=str(data["precision"]), agreement=float(data["agreement"]),
                   accuracy_delta=float(data["accuracy_delta"]),
                   speedup=MappingProxyType({k: float(v) for k, v in data["speedup"].items()}),
                   settings=MappingProxyType(dict(data["settings"])))


def _tensor(data: Mapping[str, Any]) -> TensorDecl:
    return TensorDecl(str(data["name"]), str(data["datatype"]),
                      tuple(int(d) for d in data["shape"]))


def _training(data: Mapping[str, Any]) -> TrainingInfo:
    return TrainingInfo(
        epochs=int(data["epochs"]), seed=int(data["seed"]), seconds=float(data["seconds"]),
        profile=str(data["profile"]), torch_version=str(data["torch_version"]),
        train_samples=int(data.get("train_samples", 0)),
        calib_samples=int(data.get("calib_samples", 0)),
        test_samples=int(data.get("test_samples", 0)),
        recipe=str(data.get("recipe", "")),
    )


def load_card(path: Path) -> ModelCard:
    """Read and validate the card at ``path``; ``ModelError`` when missing or invalid."""
    return card_from_dict(read_json(path, "model card"), source=f"model card {path}")


def save_card(card: ModelCard, path: Path) -> None:
    """Write ``card`` as JSON atomically (a reader never sees a half-written card)."""
    write_json(Path(path), card.to_dict(), "model card")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    return digest.hexdigest()
