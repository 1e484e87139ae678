"""What a multi-exit (early-exit) model's card says beyond every model's: its
``multi_exit`` section, an :class:`ExitNet`.

A multi-exit model is a chain of ONNX segments; each segment's first output is the feature
tensor the next one takes (a *boundary*, also a split point) and its last output is an exit's
logits. The section holds per exit its accuracy, a temperature fitted on the calibration
split, ECE before/after and its cascade curve; per segment its file, signature, latency and
MACs; per boundary the feature shape and bytes; and an operating point (thresholds chosen on
the calibration split, see :mod:`tierlink.models.exit_runner`). The card around it is the
one :class:`~tierlink.models.card.ModelCard` (format ``multi-exit``).

numpy-free and torch-free: the dataclasses and their JSON form. Who builds one (the demo's
zoo: :mod:`tierlink.zoo.exits`) is not known here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tierlink.core.types import CascadePoint
from tierlink.models.card_parts import (
    Calibration,
    calibration_from_dict,
    cascade_from_dicts,
    cascade_to_dicts,
    tensor_from_dict,
)
from tierlink.models.tensors import TensorDecl


@dataclass(frozen=True, slots=True)
class Boundary:
    """A split point between two segments: the feature tensor per sample (no batch dim)."""

    name: str
    shape: tuple[int, ...]
    fp32_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "fp32_bytes": self.fp32_bytes}


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One exported segment: its file, signature, MACs per sample and latency (ONNX Runtime,
    one thread: ``batch1_p50``, ``batch1_p95``, ``batch32_per_sample`` in ms)."""

    file: str
    sha256: str
    size_bytes: int
    input: TensorDecl
    outputs: tuple[TensorDecl, ...]
    macs: int
    latency_ms: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "size_bytes": self.size_bytes,
                "input": self.input.to_dict(), "outputs": [o.to_dict() for o in self.outputs],
                "macs": self.macs, "latency_ms": dict(self.latency_ms)}


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """One exit (the last output of the segment of the same index): accuracy on the
    calibration and test splits, its temperature and calibration measures, and its cascade
    curve on calibrated confidence (calibration split)."""

    name: str
    test_accuracy: float
    calib_accuracy: float
    temperature: float
    calibration: Calibration
    cascade: tuple[CascadePoint, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "test_accuracy": self.test_accuracy,
                "calib_accuracy": self.calib_accuracy, "temperature": self.temperature,
                "calibration": self.calibration.to_dict(),
                "cascade": cascade_to_dicts(self.cascade)}


@dataclass(frozen=True, slots=True)
class ExitEvaluation:
    """Early exit at ``thresholds`` on one split: accuracy, the share of inputs answered at
    each exit, and the mean compute per input (sum of the batch-1 latencies of the segments
    it ran) against ``full_ms``, always running every segment."""

    thresholds: tuple[float, ...]
    accuracy: float
    shares: tuple[float, ...]
    mean_ms: float
    full_ms: float

    @property
    def saved(self) -> float:
        """Share of the always-run-everything compute saved (0..1)."""
        return 1.0 - self.mean_ms / self.full_ms if self.full_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"thresholds": list(self.thresholds), "accuracy": self.accuracy,
                "shares": list(self.shares), "mean_ms": self.mean_ms,
                "full_ms": self.full_ms, "saved": round(self.saved, 5)}


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Thresholds chosen on the calibration split (cheapest within ``max_drop`` of the final
    exit's accuracy), and what they give on calibration and on test."""

    max_drop: float
    calib: ExitEvaluation
    test: ExitEvaluation
    macs_saved: float  # on test, share of the always-run-everything MACs saved

    def to_dict(self) -> dict[str, Any]:
        return {"max_drop": self.max_drop, "calib": self.calib.to_dict(),
                "test": self.test.to_dict(), "macs_saved": self.macs_saved}


@dataclass(frozen=True, slots=True)
class ExitNet:
    """What a multi-exit model's card holds beyond every model's (its ``multi_exit``
    section; see the module docstring).

    ``segments[i]`` produces ``exits[i]``; ``boundaries[i]`` is the feature tensor between
    segment i and i + 1. ``whole``: the single-graph export (file name and sha256).
    """

    base_variant: str
    loss_weights: tuple[float, ...]
    segments: tuple[SegmentInfo, ...]
    exits: tuple[ExitInfo, ...]
    boundaries: tuple[Boundary, ...]
    whole: Mapping[str, str]
    operating_point: OperatingPoint

    @property
    def temperatures(self) -> tuple[float, ...]:
        return tuple(e.temperature for e in self.exits)

    def stage_ms(self, key: str = "batch1_p50") -> tuple[float, ...]:
        """Latency of each segment (its exit included), ms."""
        return tuple(s.latency_ms[key] for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {"base_variant": self.base_variant, "loss_weights": list(self.loss_weights),
                "segments": [s.to_dict() for s in self.segments],
                "exits": [e.to_dict() for e in self.exits],
                "boundaries": [b.to_dict() for b in self.boundaries],
                "whole": dict(self.whole), "operating_point": self.operating_point.to_dict()}


def exit_net_from_dict(d: Mapping[str, Any]) -> ExitNet:
    """Parse the ``multi_exit`` section (``KeyError``/``ValueError`` on a malformed one:
    the card's reader names the card)."""
    op = d["operating_point"]
    return ExitNet(
        base_variant=str(d["base_variant"]),
        loss_weights=tuple(float(w) for w in d["loss_weights"]),
        segments=tuple(_segment(s) for s in d["segments"]),
        exits=tuple(_exit(e) for e in d["exits"]),
        boundaries=tuple(Boundary(str(b["name"]), tuple(int(x) for x in b["shape"]),
                                  int(b["fp32_bytes"])) for b in d["boundaries"]),
        whole=MappingProxyType({k: str(v) for k, v in d["whole"].items()}),
        operating_point=OperatingPoint(float(op["max_drop"]), _evaluation(op["calib"]),
                                       _evaluation(op["test"]), float(op["macs_saved"])))


def _segment(d: Mapping[str, Any]) -> SegmentInfo:
    return SegmentInfo(
        file=str(d["file"]), sha256=str(d["sha256"]), size_bytes=int(d["size_bytes"]),
        input=tensor_from_dict(d["input"]),
        outputs=tuple(tensor_from_dict(o) for o in d["outputs"]),
        macs=int(d["macs"]),
        latency_ms=MappingProxyType({k: float(v) for k, v in d["latency_ms"].items()}))


def _exit(d: Mapping[str, Any]) -> ExitInfo:
    return ExitInfo(str(d["name"]), float(d["test_accuracy"]), float(d["calib_accuracy"]),
                    float(d["temperature"]), calibration_from_dict(d["calibration"]),
                    cascade_from_dicts(d["cascade"]))


def _evaluation(d: Mapping[str, Any]) -> ExitEvaluation:
    return ExitEvaluation(tuple(float(t) for t in d["thresholds"]), float(d["accuracy"]),
                          tuple(float(s) for s in d["shares"]), float(d["mean_ms"]),
                          float(d["full_ms"]))
