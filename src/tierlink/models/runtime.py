"""What every model runtime is to the node that serves it: :class:`ModelRuntime`.

A runtime has its model's :class:`ModelInfo` (read from its card), its input and output
declarations, and one blocking ``infer`` call. It validates inputs against its signature
(:func:`validate_inputs`: a clear ``TensorError`` naming the tensor, never a crash inside the
runtime). The node runs ``infer`` on a scheduler worker thread, never on its event loop, so
``infer`` must be thread-safe for one caller at a time per worker. Runtimes are chosen by the
model's format through one registry (:mod:`tierlink.models.runtimes`); :class:`FakeModel`
is the family's deterministic fake for tests.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from tierlink.core.types import CascadePoint, ModelView, SplitPoint
from tierlink.errors import RuntimeFailure, TensorError
from tierlink.models.card import ModelCard, load_card
from tierlink.models.kind_registry import kind_of
from tierlink.models.split_profile import load_profile, profile_path
from tierlink.models.task import TaskSpec
from tierlink.models.tensors import NP_TYPES, TensorDecl

MAX_BATCH = 256


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a node knows of a model variant besides its graph: from the model card."""

    name: str
    task: str
    version: str
    accuracy: float = 0.0
    latency_ms: float = 1.0
    temperature: float = 1.0
    cascade: tuple[CascadePoint, ...] = ()
    labels: tuple[str, ...] = ()
    card: ModelCard | None = None
    splits: tuple[SplitPoint, ...] = ()  # this machine's split profile, if one was made
    profile_ms: float = 0.0  # the whole model's latency in that profile (same timing run)
    # The task as its card declares it (imported models); None: a zoo classifier whose
    # first output is its logits.
    task_spec: TaskSpec | None = None

    def spec_for(self, outputs: tuple[TensorDecl, ...]) -> TaskSpec:
        """How to read this model's outputs: its declared task, else a classifier."""
        if self.task_spec is not None:
            return self.task_spec
        return _classifier(self.task, outputs[0].name, self.labels)

    def on_provider(self, provider: str) -> ModelInfo:
        """This model as run by ``provider``: the card's latency measured on it, if any."""
        measured = self.card.latency_on(provider) if self.card else None
        if not measured:
            return self
        return replace(self, latency_ms=float(measured["batch1_p50"]))

    def view(self, latency_ms: float | None = None) -> ModelView:
        return ModelView(self.name, self.task, self.version, self.accuracy,
                         latency_ms if latency_ms is not None else self.latency_ms,
                         cascade=self.cascade, splits=self.splits)

    @classmethod
    def from_card(cls, path: Path) -> ModelInfo:
        """What the model card at ``path`` says, with this machine's split profile if one
        was made for this very file; ``ModelError`` naming the card if it is unreadable."""
        return cls.of(load_card(Path(path)), profile_path(Path(path)))

    @classmethod
    def of(cls, card: ModelCard, profile_file: Path | None = None) -> ModelInfo:
        profile = (load_profile(profile_file, sha256=card.sha256 or None)
                   if profile_file is not None else None)
        return cls(name=card.name, task=card.task, version=card.version,
                   accuracy=card.test_accuracy,
                   latency_ms=float(card.latency_ms.get("batch1_p50", 1.0)),
                   temperature=card.temperature, cascade=card.cascade, labels=card.labels,
                   card=card, splits=profile.points if profile else (),
                   profile_ms=profile.full_ms if profile else 0.0, task_spec=card.task_spec)


class ModelRuntime(Protocol):
    info: ModelInfo
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    platform: str

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def validate_inputs(
    model: str, specs: tuple[TensorDecl, ...], inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Check names, dtypes and shapes against the signature; returns the inputs to feed."""
    expected = {s.name for s in specs}
    if set(inputs) != expected:
        raise TensorError(f"model {model!r} takes inputs {sorted(expected)}, got {sorted(inputs)}")
    for spec in specs:
        _check_tensor(model, spec, inputs[spec.name])
    return inputs


def _check_tensor(model: str, spec: TensorDecl, arr: np.ndarray) -> None:
    want = NP_TYPES.get(spec.datatype)
    if want is not None and arr.dtype != want:
        raise TensorError(f"input {spec.name!r} of {model!r} must be {spec.datatype}, "
                          f"got {arr.dtype}", hint="convert the tensor before sending it")
    if arr.ndim != len(spec.shape) or any(
        d != -1 and d != a for d, a in zip(spec.shape, arr.shape, strict=True)
    ):
        raise TensorError(f"input {spec.name!r} of {model!r} must have shape "
                          f"{list(spec.shape)} (-1 = any), got {list(arr.shape)}")
    if arr.ndim and not 1 <= arr.shape[0] <= MAX_BATCH:
        raise TensorError(f"input {spec.name!r}: batch size {arr.shape[0]} is outside "
                          f"1..{MAX_BATCH}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise TensorError(f"input {spec.name!r} of {model!r} contains NaN or infinity")


class FakeModel:
    """Deterministic stand-in with the zoo's signature: logits from the input's mean, so the
    same input always gives the same answer. ``latency_ms`` blocks for real; ``fail`` raises."""

    platform = "fake"

    def __init__(self, info: ModelInfo, latency_ms: float = 0.0, classes: int = 10,
                 sharpness: float = 40.0) -> None:
        self.info = info
        self.latency_ms = latency_ms
        self.fail = threading.Event()
        self._classes = classes
        self._sharpness = sharpness
        self.calls = 0
        self.inputs = (TensorDecl("input", "FP32", (-1, 1, 28, 28)),)
        self.outputs = (TensorDecl("logits", "FP32", (-1, classes)),)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = validate_inputs(self.info.name, self.inputs, inputs)["input"]
        self.calls += 1
        if self.latency_ms:
            time.sleep(self.latency_ms / 1000.0)
        if self.fail.is_set():
            raise RuntimeFailure(f"{self.info.name}: injected failure")
        means = x.reshape(x.shape[0], -1).mean(axis=1)  # (N,)
        centers = np.linspace(0.0, 1.0, self._classes, dtype=np.float32)  # (C,)
        logits = -self._sharpness * np.abs(means[:, None] - centers[None, :])  # (N, C)
        return {"logits": logits.astype(np.float32)}


def softmax_confidence(logits: np.ndarray, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Calibrated probabilities (N, C) and per-sample confidence (N,) = max probability."""
    z = logits.astype(np.float64) / max(temperature, 1e-6)  # (N, C)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    probs = e / e.sum(axis=1, keepdims=True)
    return probs.astype(np.float32), probs.max(axis=1)


@functools.lru_cache(maxsize=256)
def _classifier(task: str, scores: str, labels: tuple[str, ...]) -> TaskSpec:
    """A zoo model's task: a classifier whose ``scores`` output holds its logits (made once,
    not on every request)."""
    return TaskSpec(task, "classification", (), MappingProxyType({"scores": scores}), labels)


def read_answer(rt: ModelRuntime, raw: dict[str, np.ndarray]) -> Any:
    """The model's raw outputs as its task's answer (tensors for the caller + confidence):
    the output kind of the task its card declares, a classifier for zoo models."""
    spec = rt.info.spec_for(rt.outputs)
    try:
        return kind_of(spec.kind).answer(raw, spec, rt.info.temperature)
    except TensorError as exc:  # the model's outputs do not fit its declared task
        raise RuntimeFailure(f"{rt.info.name}: {exc.message}") from exc


def check_task_inputs(runtimes: Iterable[ModelRuntime], task: str,
                      inputs: dict[str, np.ndarray]) -> None:
    """A malformed input is refused where it arrives, never sent up the fleet: checked
    against the signature of this node's model of ``task`` (every model of a task takes the
    same inputs), when it has one."""
    rt = next((rt for rt in runtimes if rt.info.task == task), None)
    if rt is not None:
        try:
            validate_inputs(rt.info.name, rt.inputs, inputs)
        except TensorError as exc:
            raise TensorError(f"task {task!r}: {exc.message}", hint=exc.hint) from None
