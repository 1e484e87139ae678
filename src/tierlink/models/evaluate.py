"""Evaluate a model with ONNX Runtime: its signature, its outputs on labelled data, accuracy,
cascade curves and latency. No torch: the zoo's builder, ``model import``, quantisation,
cascades and benchmarks all measure with these, so every card's figures mean the same.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import CascadePoint
from tierlink.errors import ImportRefused, ModelError
from tierlink.models.onnx import ort_session
from tierlink.models.tensors import NP_TYPES, ORT_TYPES, TensorDecl, from_ort

# The zoo's cards: 13 thresholds. Imported models' cards: a finer grid of 23.
CASCADE_THRESHOLDS: tuple[float, ...] = (
    0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95, 0.97, 0.98, 0.99,
)
FINE_THRESHOLDS: tuple[float, ...] = (
    tuple(round(0.5 + 0.025 * i, 3) for i in range(20)) + (0.99, 0.995, 0.999))
LATENCY_BUDGET_S = 3.0  # per measurement: enough runs for a stable median, bounded time


def onnx_logits(model: Path | Any, images: np.ndarray, *, batch_size: int = 500,
                threads: int = 2) -> np.ndarray:
    """Logits (N, 10) of ``images`` (N, 1, 28, 28) float32 in [0, 1].

    ``model`` is a path (a session is opened with ``threads`` threads) or an open session.
    """
    session = ort_session(model, threads) if isinstance(model, (str, Path)) else model
    name = session.get_inputs()[0].name
    # Zoo images are float32; an imported model's inputs keep their own kind (token ids).
    images = np.ascontiguousarray(images, dtype=np.float32 if images.dtype.kind == "f"
                                  else images.dtype)
    chunks = [session.run(None, {name: images[i:i + batch_size]})[0]
              for i in range(0, len(images), batch_size)]
    return np.concatenate(chunks) if chunks else np.zeros((0, 10), np.float32)


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``logits / temperature`` (N, C), numerically stable."""
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy in 0..1."""
    if len(labels) == 0:
        raise ModelError("cannot compute accuracy on an empty split")
    return float((logits.argmax(axis=1) == labels).mean())


def cascade_curve(logits: np.ndarray, labels: np.ndarray,
                  thresholds: tuple[float, ...] = CASCADE_THRESHOLDS,
                  temperature: float = 1.0) -> tuple[CascadePoint, ...]:
    """The cascade curve of a classifier's ``logits`` (:func:`cascade_points` of its max
    softmax probability). Computed on the calibration split, never on test."""
    probs = softmax(logits, temperature)
    return cascade_points(probs.max(axis=1), probs.argmax(axis=1) == labels, thresholds)


def cascade_points(confidence: np.ndarray, correct: np.ndarray,
                   thresholds: tuple[float, ...] = CASCADE_THRESHOLDS
                   ) -> tuple[CascadePoint, ...]:
    """For each threshold: the share of inputs whose ``confidence`` reaches it (the model
    answers them itself) and the accuracy on those, for any output kind with a confidence
    and a per-sample ``correct``. An empty answered set has accuracy 1.0 (no wrong
    answers)."""
    correct = np.asarray(correct, dtype=bool)
    points = []
    for t in thresholds:
        answered = confidence >= t
        n = int(answered.sum())
        acc = float(correct[answered].mean()) if n else 1.0
        points.append(CascadePoint(float(t), n / len(confidence), acc))
    return tuple(points)


def signature(session: Any) -> tuple[tuple[TensorDecl, ...], tuple[TensorDecl, ...]]:
    """(inputs, outputs) of an ONNX Runtime session; ``ImportRefused`` for a tensor type the
    Open Inference Protocol cannot carry."""
    def decl(arg: Any) -> TensorDecl:
        if arg.type not in ORT_TYPES:
            raise ImportRefused(f"tensor {arg.name!r} has type {arg.type}, which the Open "
                                "Inference Protocol cannot carry")
        return from_ort(arg)
    return (tuple(decl(i) for i in session.get_inputs()),
            tuple(decl(o) for o in session.get_outputs()))


def feed(x: Mapping[str, np.ndarray], inputs: tuple[TensorDecl, ...]) -> dict[str, np.ndarray]:
    """The data cast to the model's input datatypes; refused when shapes disagree."""
    out = {}
    for decl in inputs:
        arr = np.asarray(x[decl.name])
        want = NP_TYPES[decl.datatype]
        if arr.dtype.kind != np.dtype(want).kind and not (
                arr.dtype.kind in "iu" and np.dtype(want).kind in "iuf"):
            raise ImportRefused(f"data for input {decl.name!r} is {arr.dtype}; the model "
                                f"takes {decl.datatype}")
        arr = arr.astype(want, copy=False)
        if arr.ndim != len(decl.shape) or any(d not in (-1, a) for d, a in
                                              zip(decl.shape, arr.shape, strict=True)):
            raise ImportRefused(f"data for input {decl.name!r} has shape {list(arr.shape)}; "
                                f"the model takes {list(decl.shape)} (-1 = any)")
        out[decl.name] = np.ascontiguousarray(arr)
    return out


Predict = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]


def predictor(model: Any) -> Predict:
    """One call of a model, inputs by name to outputs by name, whatever it is: an ONNX
    Runtime session, a runtime (``predict`` on valid inputs, else ``infer``), or already
    such a callable."""
    if hasattr(model, "get_outputs"):  # an ONNX Runtime session
        names = [o.name for o in model.get_outputs()]
        return lambda feed: dict(zip(names, model.run(names, dict(feed)), strict=True))
    for method in ("predict", "infer"):
        if callable(getattr(model, method, None)):
            return getattr(model, method)  # type: ignore[no-any-return]
    return model  # type: ignore[no-any-return]


def run(model: Any, x: Mapping[str, np.ndarray], batch: int = 256,
        progress: Callable[[int], None] = lambda n: None) -> dict[str, np.ndarray]:
    """Every output of a model (:func:`predictor`) with any inputs over all of ``x``, batch
    by batch."""
    predict = predictor(model)
    n = len(next(iter(x.values())))
    chunks: dict[str, list[np.ndarray]] = {}
    for start in range(0, n, batch):
        try:
            values = predict({k: v[start:start + batch] for k, v in x.items()})
        except Exception as exc:  # the runtime's own errors: the model cannot run this data
            raise ImportRefused(f"the model fails on the data: {str(exc)[:300]}") from exc
        for k, v in values.items():
            chunks.setdefault(k, []).append(np.asarray(v))
        progress(min(batch, n - start))
    return {k: np.concatenate(v) for k, v in chunks.items()}


def latency(model: Any, x: Mapping[str, np.ndarray] | np.ndarray, *,
            runs: int | None = None, warmup: int = 20, budget_s: float = LATENCY_BUDGET_S,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Milliseconds per call of ``model`` (:func:`predictor`) on this machine:
    ``batch1_p50`` / ``batch1_p95`` of one-sample calls and ``batch32_per_sample`` (the
    median 32-sample call / 32). ``x``: the inputs by name, or the one input's array (of a
    session, whose one input it feeds). With ``runs``: exactly that many one-sample calls after
    ``warmup`` (and ``max(10, runs // 10)`` batch calls), as the zoo's cards are timed;
    without: at least 20 and at most 2,000 of each within ``budget_s``."""
    if not isinstance(x, Mapping):
        x = {model.get_inputs()[0].name: x}
    if not len(next(iter(x.values()))):
        raise ModelError("latency measurement needs at least one sample")
    predict = predictor(model)
    one = {k: v[:1] for k, v in x.items()}
    many = {k: np.concatenate([v] * math.ceil(32 / len(v)))[:32] for k, v in x.items()}
    if runs is None:
        b1 = _timed(lambda: predict(one), 3, 20, 2000, budget_s / 2, clock)
        b32 = _timed(lambda: predict(many), 3, 20, 2000, budget_s / 2, clock)
    else:
        b1 = _timed(lambda: predict(one), warmup, runs, runs, 0.0, clock)
        batches = max(10, runs // 10)
        b32 = _timed(lambda: predict(many), 0, batches, batches, 0.0, clock)
    return {"batch1_p50": float(np.percentile(b1, 50)), "batch1_p95": float(np.percentile(b1, 95)),
            "batch32_per_sample": float(np.percentile(b32, 50)) / 32.0}


def _timed(call: Callable[[], Any], warmup: int, least: int, most: int, budget_s: float,
           clock: Callable[[], float]) -> np.ndarray:
    """Milliseconds of ``least`` to ``most`` calls: more than ``least`` while within
    ``budget_s``."""
    for _ in range(warmup):
        call()
    times: list[float] = []
    end = clock() + budget_s
    while len(times) < least or (len(times) < most and clock() < end):
        t0 = clock()
        call()
        times.append((clock() - t0) * 1000.0)
    return np.asarray(times)
