"""The model card: the JSON written beside every model, whatever made it.

One :class:`ModelCard` for a model trained by the zoo, one imported by a user (an ONNX
graph or a Python class), a quantized variant, a multi-exit net and a language model. It
says what the model is (name, task, version, format, file, signature, labels, the task's
declaration), how good it is (its metric on the calibration and test data, temperature,
calibration, cascade curve), how fast it ran (per execution provider) and where it comes
from (``training`` when trained here, ``data`` when measured on a user's data, ``lineage``
when derived from another model). A format with more to say has its own section:
``multi_exit`` (:class:`~tierlink.models.exit_card.ExitNet`) and ``language``
(:class:`LanguageInfo`).

The JSON is versioned (``schema``); the reader also takes the shapes written before the
card was one (a zoo card, an import's card, an exit card, a language model's card), so a
store made by an older tierlink keeps loading. Nodes read a card to describe the model to
policies (:meth:`ModelCard.as_model_view`); caches read its ``sha256`` to tell whether the
file beside it is the one that was measured.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tierlink.core.types import CascadePoint, ModelView
from tierlink.durable import read_json, write_json  # write_json: card writers use it from here
from tierlink.errors import ConfigError, ModelError
from tierlink.models.card_parts import (
    Calibration,
    DataInfo,
    Lineage,
    TrainingInfo,
    calibration_from_dict,
    cascade_from_dicts,
    cascade_to_dicts,
    data_from_dict,
    lineage_from_dict,
    tensor_from_dict,
    training_from_dict,
)
from tierlink.models.card_upgrade import SCHEMA, upgrade
from tierlink.models.exit_card import ExitNet, exit_net_from_dict
from tierlink.models.task import TaskSpec, task_from_dict
from tierlink.models.tensors import TensorDecl

LATENCY_KEYS = ("batch1_p50", "batch1_p95", "batch32_per_sample")
TIERS = ("device", "edge", "cloud")
CPU = "CPUExecutionProvider"


@dataclass(frozen=True, slots=True)
class LanguageInfo:
    """What a language model's card says beyond every model's (its ``language`` section),
    measured once per weights file and machine (``measured_for``): architecture, context,
    KV bytes per token, prefill and decode tokens/s on one thread."""

    architecture: str
    context_length: int
    layers: int
    hidden_size: int
    kv_bytes_per_token: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    tokenizer: Mapping[str, Any]
    source: Mapping[str, Any]
    measured: Mapping[str, Any]
    measured_for: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "context_length": self.context_length,
                "layers": self.layers, "hidden_size": self.hidden_size,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "prefill_tokens_per_s": self.prefill_tokens_per_s,
                "decode_tokens_per_s": self.decode_tokens_per_s,
                "tokenizer": dict(self.tokenizer), "source": dict(self.source),
                "measured": dict(self.measured), "measured_for": self.measured_for}


def language_from_dict(d: Mapping[str, Any]) -> LanguageInfo:
    return LanguageInfo(
        architecture=str(d["architecture"]), context_length=int(d["context_length"]),
        layers=int(d["layers"]), hidden_size=int(d["hidden_size"]),
        kv_bytes_per_token=int(d["kv_bytes_per_token"]),
        prefill_tokens_per_s=float(d["prefill_tokens_per_s"]),
        decode_tokens_per_s=float(d["decode_tokens_per_s"]),
        tokenizer=MappingProxyType(dict(d.get("tokenizer") or {})),
        source=MappingProxyType(dict(d.get("source") or {})),
        measured=MappingProxyType(dict(d.get("measured") or {})),
        measured_for=str(d.get("measured_for", "")))


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ModelCard:
    """Everything known about one version of one model (see the module docstring).

    ``format`` names the runtime that serves it (``onnx``, ``multi-exit``, ``python``,
    ``llm``: :mod:`tierlink.models.runtimes`); ``file`` is its file in the version's
    directory. ``test_accuracy`` / ``calib_accuracy`` hold the task's ``metric`` on the
    test (evaluation) and calibration data. ``latency_ms`` maps ``batch1_p50``,
    ``batch1_p95`` (one sample per call) and ``batch32_per_sample`` to milliseconds on
    ``provider`` (ONNX Runtime's CPU provider on one thread for the zoo);
    ``latency_by_provider`` has the same figures for every provider it was timed on.
    ``task_spec`` is the task's declaration; ``None`` for a classifier whose first output
    is its logits (the zoo's).
    """

    name: str
    task: str
    version: str
    format: str = "onnx"
    file: str = "model.onnx"
    sha256: str = ""
    size_bytes: int = 0
    params: int = 0
    tier: str = ""
    variant: str = ""
    entry: str = ""  # a Python model's class, "module:Class"
    inputs: tuple[TensorDecl, ...] = ()
    outputs: tuple[TensorDecl, ...] = ()
    labels: tuple[str, ...] = ()
    task_spec: TaskSpec | None = None
    metric: str = "accuracy"
    test_accuracy: float = 0.0
    calib_accuracy: float = 0.0
    temperature: float = 1.0
    calibration: Calibration | None = None
    cascade: tuple[CascadePoint, ...] = ()
    latency_ms: Mapping[str, float] = field(default_factory=_empty)
    latency_by_provider: Mapping[str, Mapping[str, float]] = field(default_factory=_empty)
    provider: str = CPU
    precision: str = "fp32"
    training: TrainingInfo | None = None
    data: DataInfo | None = None
    lineage: Lineage | None = None  # None for a model that is not derived from another
    multi_exit: ExitNet | None = None
    language: LanguageInfo | None = None

    @property
    def input(self) -> TensorDecl:
        """The first input (a zoo model has one)."""
        return self.inputs[0]

    @property
    def output(self) -> TensorDecl:
        """The first output (a classifier's logits)."""
        return self.outputs[0]

    @property
    def kind(self) -> str:
        """The output kind its task reads it with."""
        if self.task_spec is not None:
            return self.task_spec.kind
        return "causal_lm" if self.format == "llm" else "classification"

    @property
    def parent(self) -> str:
        """The full-precision model this one derives from (itself when it is one)."""
        return self.lineage.parent if self.lineage else self.name

    @property
    def cascadable(self) -> bool:
        """Whether it gives a confidence a cascade can threshold (it has a curve)."""
        return bool(self.cascade)

    @property
    def imported(self) -> bool:
        """Measured on a user's data (``tierlink model import``), not trained here."""
        return self.data is not None

    def latency_on(self, provider: str) -> Mapping[str, float] | None:
        """Its latency as timed on ``provider``; ``None`` when never timed there."""
        measured = self.latency_by_provider.get(provider)
        if measured:
            return measured
        return self.latency_ms if provider == self.provider and self.latency_ms else None

    def as_model_view(self, latency_ms: float | None = None) -> ModelView:
        """The policy's view of this model; ``latency_ms`` overrides the card's batch-1 p50
        (a node passes what it measured itself)."""
        latency = self.latency_ms.get("batch1_p50", 0.0) if latency_ms is None else latency_ms
        return ModelView(name=self.name, task=self.task, version=self.version,
                         accuracy=self.test_accuracy, latency_ms=float(latency),
                         cascade=self.cascade)

    def to_dict(self) -> dict[str, Any]:
        """The card as JSON-ready data (the inverse of :func:`card_from_dict`)."""
        return {
            "schema": SCHEMA, "name": self.name, "task": self.task, "version": self.version,
            "format": self.format, "file": self.file, "sha256": self.sha256,
            "size_bytes": self.size_bytes, "params": self.params, "tier": self.tier,
            "variant": self.variant, "entry": self.entry,
            "inputs": [i.to_dict() for i in self.inputs],
            "outputs": [o.to_dict() for o in self.outputs], "labels": list(self.labels),
            "kind": self.kind,
            "task_spec": self.task_spec.to_dict() if self.task_spec else None,
            "metric": self.metric, "test_accuracy": self.test_accuracy,
            "calib_accuracy": self.calib_accuracy, "temperature": self.temperature,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "cascade": cascade_to_dicts(self.cascade),
            "latency_ms": dict(self.latency_ms),
            "latency_by_provider": {k: dict(v) for k, v in self.latency_by_provider.items()},
            "provider": self.provider, "precision": self.precision,
            "training": self.training.to_dict() if self.training else None,
            "data": self.data.to_dict() if self.data else None,
            "lineage": self.lineage.to_dict() if self.lineage else None,
            "multi_exit": self.multi_exit.to_dict() if self.multi_exit else None,
            "language": self.language.to_dict() if self.language else None,
        }


def card_from_dict(data: Mapping[str, Any], source: str = "model card") -> ModelCard:
    """Validate and convert parsed JSON (this schema or an older shape); a missing or
    malformed field is a ``ModelError`` naming the card and the field."""
    if not isinstance(data, Mapping):
        raise ModelError(f"{source} is not a JSON object")
    current = upgrade(data, source)
    unknown = sorted(set(current) - _keys())
    if unknown:
        raise ModelError(f"{source} has unknown field(s) {', '.join(map(repr, unknown))}",
                         hint=f"a schema {SCHEMA} card has {', '.join(sorted(_keys()))}")
    missing = [k for k in ("name", "task", "version") if not _given(current.get(k))]
    if missing:
        raise ModelError(f"{source} lacks field(s) {', '.join(map(repr, missing))}")
    try:
        card = _convert(current)
    except (TypeError, ValueError, KeyError, AttributeError, ConfigError) as exc:
        raise ModelError(f"{source} has a malformed field: {exc!r}") from exc
    if card.multi_exit is not None and not card.inputs:
        card = with_exit_header(card)
    if card.tier and card.tier not in TIERS:
        raise ModelError(f"{source} field 'tier' is {card.tier!r}; expected one of {TIERS}")
    if card.latency_ms and "batch1_p50" not in card.latency_ms:
        raise ModelError(f"{source} field 'latency_ms' lacks 'batch1_p50' (of {LATENCY_KEYS})")
    return card


@functools.cache
def _keys() -> frozenset[str]:
    """The fields of a card's JSON."""
    return frozenset(ModelCard("", "", "").to_dict())


def _given(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def _convert(d: Mapping[str, Any]) -> ModelCard:
    name, task = str(d["name"]), str(d["task"])
    spec = d.get("task_spec")
    return ModelCard(
        name=name, task=task, version=str(d["version"]), format=str(d.get("format", "onnx")),
        file=str(d.get("file", "model.onnx")), sha256=str(d.get("sha256", "")),
        size_bytes=int(d.get("size_bytes", 0)), params=int(d.get("params", 0)),
        tier=str(d.get("tier", "")), variant=str(d.get("variant", "")),
        entry=str(d.get("entry", "")),
        inputs=tuple(tensor_from_dict(t) for t in d.get("inputs", ())),
        outputs=tuple(tensor_from_dict(t) for t in d.get("outputs", ())),
        labels=tuple(str(x) for x in d.get("labels", ())),
        task_spec=task_from_dict(task, spec, f"card of {name}") if spec else None,
        metric=str(d.get("metric", "accuracy")),
        test_accuracy=float(d.get("test_accuracy") or 0.0),
        calib_accuracy=float(d.get("calib_accuracy") or 0.0),
        temperature=float(d.get("temperature", 1.0)),
        calibration=_section(d, "calibration", calibration_from_dict),
        cascade=cascade_from_dicts(d.get("cascade", ())),
        latency_ms=_timings(d.get("latency_ms") or {}),
        latency_by_provider=MappingProxyType(
            {str(k): _timings(v) for k, v in (d.get("latency_by_provider") or {}).items()}),
        provider=str(d.get("provider", CPU)), precision=str(d.get("precision", "fp32")),
        training=_section(d, "training", training_from_dict),
        data=_section(d, "data", data_from_dict),
        lineage=lineage_from_dict(d.get("lineage")),
        multi_exit=_section(d, "multi_exit", exit_net_from_dict),
        language=_section(d, "language", language_from_dict),
    )


def with_exit_header(card: ModelCard) -> ModelCard:
    """A multi-exit card with what every card says read off its net: the first segment's
    input, the answer (calibrated logits and the exit taken), the operating point's
    accuracies, the final exit's curve, the single-graph file, the segments' bytes."""
    net = card.multi_exit
    if net is None:
        raise ModelError(f"{card.name} is not a multi-exit model")
    first, op = net.segments[0].input, net.operating_point
    return replace(
        card, format="multi-exit", file=net.whole.get("file", card.file),
        sha256=net.whole.get("sha256", card.sha256),
        size_bytes=sum(s.size_bytes for s in net.segments),
        inputs=(TensorDecl(first.name, "FP32", (-1, *first.shape[1:])),),
        outputs=(TensorDecl("logits", "FP32", (-1, len(card.labels))),
                 TensorDecl("exit", "INT64", (-1,))),
        test_accuracy=op.test.accuracy, calib_accuracy=op.calib.accuracy,
        cascade=net.exits[-1].cascade,
        latency_ms=MappingProxyType({k: float(v) for k, v in zip(
            LATENCY_KEYS, _exit_latency(net), strict=True)}))


def _exit_latency(net: ExitNet) -> tuple[float, float, float]:
    """Mean batch-1 compute per input at the operating point (p50 and p95 alike: what the
    node's policies plan with), and every segment's batch-32 cost per sample."""
    mean = net.operating_point.test.mean_ms
    return mean, mean, sum(s.latency_ms["batch32_per_sample"] for s in net.segments)


def _section(d: Mapping[str, Any], name: str, parse: Any) -> Any:
    """Section ``name`` of the card parsed, or None; a malformed one names itself
    (``ValueError``)."""
    data = d.get(name)
    if data is None:
        return None
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"section {name!r}: {exc!r}") from exc


def _timings(data: Mapping[str, Any]) -> Mapping[str, float]:
    return MappingProxyType({str(k): float(v) for k, v in data.items()})


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


__all__ = ["CPU", "LATENCY_KEYS", "TIERS", "Calibration", "DataInfo", "LanguageInfo",
           "Lineage", "ModelCard", "TrainingInfo", "calibration_from_dict",
           "card_from_dict", "cascade_from_dicts", "file_sha256", "load_card", "save_card",
           "write_json"]
