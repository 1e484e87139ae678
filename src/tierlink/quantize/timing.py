"""Side-by-side latency: several models timed interleaved in one run, one thread.

On a shared machine, load drifts within seconds; timing a parent and its variant minutes
apart measures the drift. Here every round times each model for a short block, in turn
(the order rotates each round), so drift hits all alike; the medians over all rounds are
compared as ratios.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from tierlink.errors import QuantizationError

BATCH = 32


@dataclass(frozen=True, slots=True)
class Timing:
    """Per model: ``batch1_p50`` / ``batch1_p95`` (ms per one-image call) and
    ``batch32_per_sample`` (median ms of a 32-image call / 32) — the card's latency keys."""

    latency_ms: Mapping[str, dict[str, float]]

    def speedup(self, name: str, reference: str) -> dict[str, float]:
        """``reference`` latency / ``name`` latency (> 1: ``name`` is faster)."""
        a, b = self.latency_ms[reference], self.latency_ms[name]
        return {"batch1": round(a["batch1_p50"] / b["batch1_p50"], 4),
                "batch32": round(a["batch32_per_sample"] / b["batch32_per_sample"], 4)}


def side_by_side(sessions: Mapping[str, Any], images: np.ndarray, *, rounds: int = 30,
                 calls: int = 20, batch_calls: int = 3, warmup: int = 10,
                 clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time every session in ``sessions`` (ONNX Runtime sessions, ideally one thread each)
    interleaved: ``rounds`` rounds of ``calls`` one-image and ``batch_calls`` 32-image calls
    per model. ``images`` (>= 32, 1, 28, 28) float32."""
    if len(images) < BATCH:
        raise QuantizationError(f"latency needs at least {BATCH} images, got {len(images)}")
    dtype = np.float32 if images.dtype.kind == "f" else images.dtype  # token ids stay ints
    one = np.ascontiguousarray(images[:1], dtype=dtype)
    many = np.ascontiguousarray(images[:BATCH], dtype=dtype)
    names = list(sessions)
    feeds = {n: sessions[n].get_inputs()[0].name for n in names}
    single: dict[str, list[float]] = {n: [] for n in names}
    batch: dict[str, list[float]] = {n: [] for n in names}
    for n in names:
        for _ in range(warmup):
            sessions[n].run(None, {feeds[n]: one})
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
            run, one_feed, many_feed = sessions[n].run, {feeds[n]: one}, {feeds[n]: many}
            single[n] += _times(partial(run, None, one_feed), calls, clock)
            batch[n] += _times(partial(run, None, many_feed), batch_calls, clock)
    return Timing({n: {"batch1_p50": float(np.percentile(single[n], 50)),
                       "batch1_p95": float(np.percentile(single[n], 95)),
                       "batch32_per_sample": float(np.median(batch[n])) / BATCH}
                   for n in names})


def _times(call: Callable[[], Any], n: int, clock: Callable[[], float]) -> list[float]:
    out = []
    for _ in range(n):
        start = clock()
        call()
        out.append((clock() - start) * 1000.0)
    return out
