"""What ``model import`` measures of a model: its signature, its outputs on labelled data,
latency per execution provider, a fitted temperature, its cascade curve. numpy + ONNX
Runtime; no writes."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tierlink.errors import ImportRefused
from tierlink.node.runtime import NP_TYPES, ORT_TYPES
from tierlink.tasks.kinds import (
    OutputKind,
    class_ids,
    multilabel_targets,
    sigmoid,
    softmax,
)
from tierlink.tasks.spec import TaskSpec, TensorDecl

CURVE = tuple(round(0.5 + 0.025 * i, 3) for i in range(20)) + (0.99, 0.995, 0.999)
LATENCY_BUDGET_S = 3.0  # per measurement: enough runs for a stable median, bounded time


def signature(session: Any) -> tuple[tuple[TensorDecl, ...], tuple[TensorDecl, ...]]:
    def decl(arg: Any) -> TensorDecl:
        dtype = ORT_TYPES.get(arg.type)
        if dtype is None:
            raise ImportRefused(f"tensor {arg.name!r} has type {arg.type}, which the Open "
                                "Inference Protocol cannot carry")
        return TensorDecl(arg.name, dtype, tuple(d if isinstance(d, int) and d > 0 else -1
                                                 for d in arg.shape))
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


def run(session: Any, x: Mapping[str, np.ndarray], batch: int = 256,
        progress: Callable[[int], None] = lambda n: None) -> dict[str, np.ndarray]:
    """Every output over all of ``x``, batch by batch."""
    names = [o.name for o in session.get_outputs()]
    n = len(next(iter(x.values())))
    chunks: dict[str, list[np.ndarray]] = {k: [] for k in names}
    for start in range(0, n, batch):
        try:
            values = session.run(names, {k: v[start:start + batch] for k, v in x.items()})
        except Exception as exc:  # onnxruntime's own errors: the model cannot run this data
            raise ImportRefused(f"the model fails on the data: {str(exc)[:300]}") from exc
        for k, v in zip(names, values, strict=True):
            chunks[k].append(np.asarray(v))
        progress(min(batch, n - start))
    return {k: np.concatenate(v) for k, v in chunks.items()}


def latency(session: Any, x: Mapping[str, np.ndarray], budget_s: float = LATENCY_BUDGET_S,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Batch-1 p50/p95 and batch-32 per-sample milliseconds on this machine."""
    one = {k: v[:1] for k, v in x.items()}
    many = {k: np.concatenate([v] * math.ceil(32 / len(v)))[:32] for k, v in x.items()}
    b1 = _timed(lambda: session.run(None, one), budget_s / 2, clock)
    b32 = _timed(lambda: session.run(None, many), budget_s / 2, clock)
    return {"batch1_p50": float(np.percentile(b1, 50)), "batch1_p95": float(np.percentile(b1, 95)),
            "batch32_per_sample": float(np.percentile(b32, 50)) / 32.0}


def _timed(call: Callable[[], Any], budget_s: float, clock: Callable[[], float]) -> np.ndarray:
    for _ in range(3):
        call()  # warm-up
    times: list[float] = []
    end = clock() + budget_s
    while len(times) < 20 or (clock() < end and len(times) < 2000):
        t0 = clock()
        call()
        times.append((clock() - t0) * 1000.0)
    return np.asarray(times)


def fit_temperature(kind: OutputKind, raw: Mapping[str, np.ndarray], y: np.ndarray,
                    task: TaskSpec) -> tuple[float, float, float]:
    """(temperature, NLL before, NLL after) on the calibration part: the zoo's search
    (``zoo.calibration.best_temperature``) on the kind's NLL; 1.0 where the kind fits none."""
    from tierlink.zoo.calibration import best_temperature

    logits = kind.logits(raw, task) if kind.temperature_fit else None
    if logits is None:
        return 1.0, math.nan, math.nan
    loss = _nll(kind.name, logits, np.asarray(y))
    t = best_temperature(loss)
    return t, loss(1.0), loss(t)


def _nll(kind: str, logits: np.ndarray, y: np.ndarray) -> Callable[[float], float]:
    if kind == "multilabel":
        target = multilabel_targets(y, logits.shape).astype(np.float64)

        def bce(t: float) -> float:
            p = np.clip(sigmoid(logits, t).astype(np.float64), 1e-12, 1 - 1e-12)
            return float(-(target * np.log(p) + (1 - target) * np.log(1 - p)).mean())
        return bce
    labels = class_ids(y, logits.shape)

    def ce(t: float) -> float:
        p = softmax(logits, t).astype(np.float64)[np.arange(len(labels)), labels]
        return float(-np.log(np.clip(p, 1e-12, None)).mean())
    return ce


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error: the count-weighted |accuracy - confidence| over equal-width
    confidence bins (the zoo's definition, for any kind with a confidence)."""
    index = np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)
    conf = np.bincount(index, weights=confidence, minlength=bins)
    acc = np.bincount(index, weights=correct.astype(np.float64), minlength=bins)
    return float(np.abs(acc - conf).sum() / max(1, len(confidence)))


def cascade_curve(confidence: np.ndarray, correct: np.ndarray) -> list[dict[str, float]]:
    """Per threshold: the share answered at or above it and their accuracy (calibration)."""
    points = []
    for t in CURVE:
        answered = confidence >= t
        n = int(answered.sum())
        points.append({"threshold": t, "answered_share": n / len(confidence),
                       "answered_accuracy": float(correct[answered].mean()) if n else 1.0})
    return points
