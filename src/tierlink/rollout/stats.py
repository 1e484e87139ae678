"""Per-version serving statistics that nodes report, and the gate math on them. Pure.

Each heartbeat carries, per served model version, counters that are **cumulative since that
version became active on the node** (``since``, epoch seconds). The rollout machine never
reads rates off one heartbeat: it keeps the counters seen when a stage's soak began and takes
a *window* = cumulative now − cumulative then (:meth:`VersionStats.minus`). A node restart
sets the counters back to zero; :meth:`~VersionStats.minus` sees that (``since`` changed, or a
counter went down) and takes the current counters as the window, so a restart loses at most
what the node served before it, never makes a count negative.

Decoding (:meth:`VersionStats.from_dict`) is **tolerant of missing fields and strict on bad
ones**: a field a node does not report (an older node, one with no labelled feedback) counts
as zero; a present field of the wrong type, a negative count, a histogram of the wrong length
or ``feedback_correct > feedback`` raises :class:`~tierlink.errors.InvalidRequest` naming the
field. Unknown fields are ignored (newer nodes may report more).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from tierlink.errors import InvalidRequest

# Upper bounds (ms) of the latency histogram; a request of latency x counts in the first
# bucket whose bound is >= x (Prometheus ``le`` buckets, not cumulative).
LATENCY_BUCKETS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000,
                                         math.inf)
# Confidence (max-softmax) histogram: bin i holds [i/10, (i+1)/10), the last also 1.0.
CONFIDENCE_BINS = 10

_HINT = ("per-version stats are {requests, errors, escalations, latency_ms_buckets[13], "
         "confidence_buckets[10], feedback, feedback_correct, mirrored, agreed, since}; counts "
         "are non-negative integers, cumulative since the version became active")
_COUNTS = ("requests", "errors", "escalations", "feedback", "feedback_correct", "mirrored",
           "agreed")
_HISTOGRAMS = {"latency_ms_buckets": len(LATENCY_BUCKETS_MS),
               "confidence_buckets": CONFIDENCE_BINS}


def _zeros(n: int) -> tuple[int, ...]:
    return (0,) * n


@dataclass(frozen=True, slots=True)
class VersionStats:
    """Counters of one model version on one node (or summed over nodes, or a window).

    ``latency_ms_buckets``: requests per bucket of :data:`LATENCY_BUCKETS_MS`;
    ``confidence_buckets``: answers per confidence bin; ``escalations``: inputs this version
    passed upstream for low confidence; ``feedback`` / ``feedback_correct``: labelled
    feedback received for its answers, and how many of those answers were right."""

    requests: int = 0
    errors: int = 0
    escalations: int = 0
    latency_ms_buckets: tuple[int, ...] = _zeros(len(LATENCY_BUCKETS_MS))
    confidence_buckets: tuple[int, ...] = _zeros(CONFIDENCE_BINS)
    feedback: int = 0
    feedback_correct: int = 0
    mirrored: int = 0
    agreed: int = 0
    since: float = 0.0

    def __post_init__(self) -> None:
        for name in _COUNTS:
            if getattr(self, name) < 0:
                raise InvalidRequest(f"stats.{name} is negative", hint=_HINT)
        for name, size in _HISTOGRAMS.items():
            counts = getattr(self, name)
            if len(counts) != size:
                raise InvalidRequest(f"stats.{name} has {len(counts)} buckets, expected "
                                     f"{size}", hint=_HINT)
            if any(c < 0 for c in counts):
                raise InvalidRequest(f"stats.{name} has a negative count", hint=_HINT)

    # -- JSON --------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VersionStats:
        """Decode a heartbeat's stats dict (missing fields are zero; see the module doc)."""
        if not isinstance(data, Mapping):
            raise InvalidRequest("stats must be an object", hint=_HINT)
        lat, conf = (_histogram(data, name, size) for name, size in _HISTOGRAMS.items())
        if _count(data, "feedback_correct") > _count(data, "feedback"):
            raise InvalidRequest("stats.feedback_correct exceeds stats.feedback", hint=_HINT)
        if _count(data, "agreed") > _count(data, "mirrored"):
            raise InvalidRequest("stats.agreed exceeds stats.mirrored", hint=_HINT)
        return cls(requests=_count(data, "requests"), errors=_count(data, "errors"),
                   escalations=_count(data, "escalations"), latency_ms_buckets=lat,
                   confidence_buckets=conf, feedback=_count(data, "feedback"),
                   feedback_correct=_count(data, "feedback_correct"),
                   mirrored=_count(data, "mirrored"), agreed=_count(data, "agreed"),
                   since=_since(data))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _HISTOGRAMS:
            out[name] = list(out[name])
        return out

    # -- windows -----------------------------------------------------------------------

    def is_reset_since(self, earlier: VersionStats) -> bool:
        """Whether the counters restarted after ``earlier`` was seen (a node restart, or
        the version became active again): ``since`` moved, or any counter went down."""
        if self.since != earlier.since:
            return True
        pairs = [(getattr(self, n), getattr(earlier, n)) for n in _COUNTS]
        for name in _HISTOGRAMS:
            pairs.extend(zip(getattr(self, name), getattr(earlier, name), strict=True))
        return any(now < then for now, then in pairs)

    def minus(self, earlier: VersionStats | None) -> VersionStats:
        """The window between ``earlier`` (cumulative at the window's start) and ``self``.

        On a reset (:meth:`is_reset_since`) the window is ``self``: everything counted
        since the restart. ``None`` (the version was not reported then) also gives ``self``."""
        if earlier is None or self.is_reset_since(earlier):
            return self
        return _combine(self, earlier, operator.sub, self.since)

    def plus(self, other: VersionStats) -> VersionStats:
        """Counters summed (e.g. over nodes); ``since`` is the earlier non-zero one."""
        sinces = [s for s in (self.since, other.since) if s > 0]
        return _combine(self, other, operator.add, min(sinces) if sinces else 0.0)

    @staticmethod
    def total(items: Iterable[VersionStats]) -> VersionStats:
        """The sum of ``items`` (empty stats for none)."""
        out = VersionStats()
        for item in items:
            out = out.plus(item)
        return out

    # -- figures -----------------------------------------------------------------------

    @property
    def timed(self) -> int:
        """Requests in the latency histogram (may be fewer than ``requests``: errors)."""
        return sum(self.latency_ms_buckets)

    @property
    def answers(self) -> int:
        """Answers in the confidence histogram."""
        return sum(self.confidence_buckets)

    def error_rate(self) -> float | None:
        """errors / requests; None without requests."""
        return self.errors / self.requests if self.requests else None

    def escalation_rate(self) -> float | None:
        """escalations / requests; None without requests."""
        return self.escalations / self.requests if self.requests else None

    def feedback_accuracy(self) -> float | None:
        """Share of labelled feedback that found the answer right; None without feedback."""
        return self.feedback_correct / self.feedback if self.feedback else None

    def agreement(self) -> float | None:
        """Share of mirrored samples the most capable model answered the same way; None
        without mirrored samples."""
        return self.agreed / self.mirrored if self.mirrored else None

    def p95_ms(self) -> float | None:
        """p95 latency as the upper bound of the bucket holding it (``inf`` if that is the
        overflow bucket); None without timed requests. Coarse: bounds step 2-2.5x."""
        return self.quantile_ms(0.95, interpolate=False)

    def quantile_ms(self, q: float, *, interpolate: bool = True) -> float | None:
        """Latency quantile ``q`` in (0, 1] from the histogram; None if it is empty.

        ``interpolate``: linear inside the bucket, as Prometheus' ``histogram_quantile``
        (the overflow bucket answers its lower bound, 5000 ms); else the bucket's upper
        bound. The gates interpolate, so a small shift across a bound does not read as a
        2.5x regression."""
        total = self.timed
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for i, count in enumerate(self.latency_ms_buckets):
            if count > 0 and seen + count >= rank:
                return _in_bucket(i, (rank - seen) / count, interpolate)
            seen += count
        return _in_bucket(len(LATENCY_BUCKETS_MS) - 1, 1.0, interpolate)  # float round-off


def _combine(a: VersionStats, b: VersionStats, op: Callable[[int, int], int],
             since: float) -> VersionStats:
    """Field by field ``op(a, b)`` (histograms bucket by bucket)."""
    def hist(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(op(i, j) for i, j in zip(x, y, strict=True))
    feedback = op(a.feedback, b.feedback)
    # A heartbeat may catch feedback and feedback_correct between their two increments,
    # so a window can show one more correct than labelled: clamp, never raise.
    correct = min(feedback, op(a.feedback_correct, b.feedback_correct))
    mirrored = op(a.mirrored, b.mirrored)  # the same race, the same clamp
    agreed = min(mirrored, op(a.agreed, b.agreed))
    return VersionStats(
        requests=op(a.requests, b.requests), errors=op(a.errors, b.errors),
        escalations=op(a.escalations, b.escalations),
        latency_ms_buckets=hist(a.latency_ms_buckets, b.latency_ms_buckets),
        confidence_buckets=hist(a.confidence_buckets, b.confidence_buckets),
        feedback=feedback, feedback_correct=correct, mirrored=mirrored, agreed=agreed,
        since=since)


def _in_bucket(i: int, position: float, interpolate: bool) -> float:
    upper = LATENCY_BUCKETS_MS[i]
    lower = LATENCY_BUCKETS_MS[i - 1] if i > 0 else 0.0
    if not interpolate:
        return upper
    if math.isinf(upper):
        return lower
    return lower + (upper - lower) * position


def psi(expected: Sequence[float], actual: Sequence[float], eps: float = 1e-4) -> float:
    """Population stability index of ``actual`` against ``expected`` (two histograms over
    the same bins, raw counts): ``sum((a_i - e_i) * ln(a_i / e_i))`` over bin shares.

    Shares are smoothed as ``(c_i / total + eps) / (1 + k * eps)`` so an empty bin gives a
    large but finite term instead of a division by zero. The usual reading: < 0.1 stable,
    0.1-0.25 a moderate shift, > 0.25 a significant shift. Sampling noise alone gives about
    ``(bins - 1) * (1/n_expected + 1/n_actual)``, so compare histograms of at least a few
    hundred answers. ``ValueError`` (a caller's bug) on mismatched or empty histograms."""
    if len(expected) != len(actual) or not expected:
        raise ValueError(f"psi needs two histograms over the same bins, got "
                         f"{len(expected)} and {len(actual)}")
    if eps <= 0:
        raise ValueError("psi needs eps > 0")
    te, ta = float(sum(expected)), float(sum(actual))
    if te <= 0 or ta <= 0:
        raise ValueError("psi needs two non-empty histograms")
    k = len(expected)
    total = 0.0
    for e, a in zip(expected, actual, strict=True):
        pe = (e / te + eps) / (1 + k * eps)
        pa = (a / ta + eps) / (1 + k * eps)
        total += (pa - pe) * math.log(pa / pe)
    return total


def merge_sparse(expected: Sequence[int], actual: Sequence[int], min_count: int = 10
                 ) -> tuple[list[int], list[int]]:
    """Both histograms with adjacent bins merged (from the first) until each merged bin
    holds at least ``min_count`` answers of the two together; a short tail joins the last
    bin. PSI over bins that hold a handful of answers is mostly its smoothing: a confidence
    histogram with 80% of its answers in the top bin leaves the low bins at 0-2 answers
    over a hundred, where one answer more or less moves PSI by 0.05-0.1."""
    out_e: list[int] = []
    out_a: list[int] = []
    e_sum = a_sum = 0
    for e, a in zip(expected, actual, strict=True):
        e_sum, a_sum = e_sum + e, a_sum + a
        if e_sum + a_sum >= min_count:
            out_e.append(e_sum)
            out_a.append(a_sum)
            e_sum = a_sum = 0
    if e_sum + a_sum:
        if out_e:
            out_e[-1] += e_sum
            out_a[-1] += a_sum
        else:
            out_e, out_a = [e_sum], [a_sum]
    return out_e, out_a


def _is_count(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _count(data: Mapping[str, Any], name: str) -> int:
    value = data.get(name, 0)
    if not _is_count(value) or value < 0:
        raise InvalidRequest(f"stats.{name} must be a non-negative integer, got {value!r}",
                             hint=_HINT)
    return int(value)


def _histogram(data: Mapping[str, Any], name: str, size: int) -> tuple[int, ...]:
    value = data.get(name)
    if value is None:
        return _zeros(size)
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise InvalidRequest(f"stats.{name} must be a list of {size} counts", hint=_HINT)
    if len(value) != size or not all(_is_count(c) and c >= 0 for c in value):
        raise InvalidRequest(f"stats.{name} must be a list of {size} non-negative integer "
                             f"counts, got {len(value)} items", hint=_HINT)
    return tuple(int(c) for c in value)


def _since(data: Mapping[str, Any]) -> float:
    value = data.get("since", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
            or not math.isfinite(value):
        raise InvalidRequest(f"stats.since must be epoch seconds, got {value!r}", hint=_HINT)
    return float(value)
