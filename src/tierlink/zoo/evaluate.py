"""Run zoo ONNX models with ONNX Runtime: logits on a split, accuracy, cascade curves and
latency. No torch: quantisation, benchmarks and the builder all use these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import CascadePoint
from tierlink.errors import ZooError
from tierlink.onnxrt import ort_session  # re-exported: zoo code opens sessions from here

CASCADE_THRESHOLDS: tuple[float, ...] = (
    0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95, 0.97, 0.98, 0.99,
)


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
        raise ZooError("cannot compute accuracy on an empty split")
    return float((logits.argmax(axis=1) == labels).mean())


def cascade_curve(logits: np.ndarray, labels: np.ndarray,
                  thresholds: tuple[float, ...] = CASCADE_THRESHOLDS,
                  temperature: float = 1.0) -> tuple[CascadePoint, ...]:
    """For each threshold: the share of inputs whose max softmax probability reaches it
    (the model answers them itself) and the accuracy on those. An empty answered set has
    accuracy 1.0 (no wrong answers). Computed on the calibration split, never on test."""
    probs = softmax(logits, temperature)
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    points = []
    for t in thresholds:
        answered = confidence >= t
        n = int(answered.sum())
        acc = float(correct[answered].mean()) if n else 1.0
        points.append(CascadePoint(float(t), n / len(labels), acc))
    return tuple(points)


def measure_latency(session: Any, sample: np.ndarray, *, runs: int = 200, warmup: int = 20,
                    clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Milliseconds per call: ``batch1_p50`` / ``batch1_p95`` over ``runs`` one-image calls,
    ``batch32_per_sample`` = median 32-image call / 32. ``sample`` (>= 32, 1, 28, 28)."""
    name = session.get_inputs()[0].name
    one, many = sample[:1], sample[:32]
    if len(many) < 32:
        raise ZooError("latency measurement needs at least 32 sample images")
    for _ in range(warmup):
        session.run(None, {name: one})
    single = _timed(lambda: session.run(None, {name: one}), runs, clock)
    batch = _timed(lambda: session.run(None, {name: many}), max(10, runs // 10), clock)
    return {"batch1_p50": float(np.percentile(single, 50)),
            "batch1_p95": float(np.percentile(single, 95)),
            "batch32_per_sample": float(np.median(batch)) / 32}


def _timed(call: Callable[[], Any], runs: int, clock: Callable[[], float]) -> np.ndarray:
    times = np.empty(runs)
    for i in range(runs):
        start = clock()
        call()
        times[i] = (clock() - start) * 1000.0
    return times
