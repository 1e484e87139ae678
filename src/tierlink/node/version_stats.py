"""What each model version answered on this node, for rollout health gates.

Per ``(model name, version)``: requests answered, errors, escalations (answers passed on for
low confidence), a latency histogram, a confidence histogram (10 bins), and — where the
client sent labels (``tierlink.label``) — how many answers were checked and how many were
right; where the fleet mirrors (``routing.mirror``), how many answered samples were mirrored
to the most capable model the request's privacy allows and how many of those it agreed with. Counters are cumulative for the life of the process; the rollout controller works on
differences between heartbeats (and treats a counter that went down as a restart). The dict
form is what heartbeats carry (``ModelSpec.stats``) and what
``tierlink.rollout.stats.VersionStats.from_dict`` reads.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

LATENCY_BUCKETS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000,
                                         math.inf)
CONFIDENCE_BINS = 10


@dataclass(slots=True)
class _Counts:
    since: float
    requests: int = 0
    errors: int = 0
    escalations: int = 0
    latency: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_MS))
    confidence: list[int] = field(default_factory=lambda: [0] * CONFIDENCE_BINS)
    feedback: int = 0
    feedback_correct: int = 0
    mirrored: int = 0
    agreed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors,
                "escalations": self.escalations, "latency_ms_buckets": list(self.latency),
                "confidence_buckets": list(self.confidence), "feedback": self.feedback,
                "feedback_correct": self.feedback_correct, "mirrored": self.mirrored,
                "agreed": self.agreed, "since": self.since}


class VersionStatsBook:
    """Thread-safe counters per (name, version); ``clock`` (epoch s) stamps first use."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], _Counts] = {}

    def _get(self, name: str, version: str) -> _Counts:
        key = (name, version)
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = _Counts(since=self._clock())
        return counts

    def answered(self, name: str, version: str, latency_ms: float,
                 confidences: Sequence[float], predictions: Sequence[int] = (),
                 labels: Sequence[int] | None = None) -> None:
        """One request answered: its latency, each sample's confidence, and the labels the
        client sent (-1: unknown) against the predictions."""
        with self._lock:
            c = self._get(name, version)
            c.requests += 1
            c.latency[bisect.bisect_left(LATENCY_BUCKETS_MS, latency_ms)] += 1
            for conf in confidences:
                c.confidence[min(CONFIDENCE_BINS - 1, max(0, int(conf * CONFIDENCE_BINS)))] += 1
            for pred, label in zip(predictions, labels or (), strict=False):
                if label >= 0:
                    c.feedback += 1
                    c.feedback_correct += int(pred == label)

    def failed(self, name: str, version: str) -> None:
        with self._lock:
            self._get(name, version).errors += 1

    def escalated(self, name: str, version: str) -> None:
        with self._lock:
            self._get(name, version).escalations += 1

    def mirrored(self, name: str, version: str, samples: int, agreed: int) -> None:
        """``samples`` of one of this version's answers were answered again by the most
        capable model (node/mirroring.py); ``agreed`` of them the same way."""
        with self._lock:
            c = self._get(name, version)
            c.mirrored += samples
            c.agreed += agreed

    def get(self, name: str, version: str) -> dict[str, Any] | None:
        with self._lock:
            counts = self._counts.get((name, version))
            return None if counts is None else counts.to_dict()
