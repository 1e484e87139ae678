"""Health gates: compare a new version's window against its baseline. Pure.

Each gate gives a :class:`Verdict` (pass, fail, suspect, insufficient data) with the figure, the
threshold and a sentence a person can act on. Gates compare the new version with the
*previous* version over the same window (same load, same hours), so a slow afternoon does not
read as a regression. Where the same window holds too little of the previous version (every
node moved), the caller passes a second baseline (the previous version before this stage);
each gate takes the first baseline with enough data for it.

Defaults (``Gates()``), and why:

* ``max_error_rate_delta=0.02``: fail when the error rate rises by more than 2 points;
* ``max_p95_ratio=1.5`` and ``min_p95_increase_ms=5``: fail when p95 latency grows by more
  than 1.5x *and* by more than 5 ms (1 -> 2 ms is not a regression worth a rollback);
* ``max_escalation_delta=0.05``: fail when 5 more points of inputs are passed upstream
  (a less confident model costs the upstream tiers);
* ``max_psi=0.25``: fail on a significant shift of the confidence distribution (PSI reading:
  < 0.1 stable, 0.1-0.25 moderate, > 0.25 significant) that sampling noise does not
  explain: PSI scaled by ``n * nb / (n + nb)`` is about chi-square over the bins under no
  shift, so a PSI past the threshold but under that chi-square's ``min_z`` quantile is
  ``suspect``. PSI is taken over the confidence bins merged until each holds >= 10 answers
  of the two windows (``merge_sparse``): a device model puts ~80% of its answers in the
  top bin, and over a hundred answers the low bins' 0-2 answers would be most of PSI;
* ``max_accuracy_drop_pt=2.0`` with ``min_feedback=100``: fail when accuracy on labelled
  feedback drops by more than 2 points, judged only with >= 100 labelled answers on each side
  (fewer: insufficient data, which does not block promotion — feedback is optional);
* ``max_agreement_drop_pt=3.0`` with ``min_mirrored=50``: fail when the share of mirrored
  samples the most capable model answers the same way (``routing.mirror``: no labels
  needed) drops by more than 3 points against the previous version's, judged with >= 50
  mirrored samples on each side. Against the previous version, not against 100%: a smaller
  model disagrees with a larger one on a few percent of all inputs when healthy (less on
  those it answers itself: the demo's device and edge models on 0.05% of those), and a
  version confidently wrong on one class of ten loses about ten points. Without mirroring the gate has no data and, like feedback, does not block;
* ``min_z=2.58``: the proportion gates (error rate, escalation rate, feedback accuracy,
  agreement) fail
  only when the regression is also *significant* — a one-sided two-proportion z-test
  (unpooled) with z >= 2.58, about 0.5% false alarms per look. With 150 labelled answers
  at 91%, sampling noise alone is +-2.3 pt: a point estimate past 2 pt proves nothing.
  Beyond the threshold but not yet significant, the verdict is ``suspect``: the stage does
  not pass on it; it soaks on for more data.

Rate gates need ``min_requests`` requests on each side (the rollout spec sets it).
Outcomes: ``pass``; ``fail`` (rolls back); ``suspect`` (holds the stage); ``insufficient``
(too few samples: holds the stage only through the rollout's request minimum — a signal
such as feedback that may never come does not block it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from tierlink.errors import ConfigError
from tierlink.rollout.stats import VersionStats, merge_sparse, psi

_GATES_HINT = ("gates: max_error_rate_delta, max_p95_ratio, min_p95_increase_ms, "
               "max_escalation_delta, max_psi, max_accuracy_drop_pt, min_feedback, "
               "max_agreement_drop_pt, min_mirrored, min_z")


@dataclass(frozen=True, slots=True)
class Gates:
    """Thresholds of the health gates (see the module doc for the defaults)."""

    max_error_rate_delta: float = 0.02
    max_p95_ratio: float = 1.5
    min_p95_increase_ms: float = 5.0
    max_escalation_delta: float = 0.05
    max_psi: float = 0.25
    max_accuracy_drop_pt: float = 2.0
    min_feedback: int = 100
    max_agreement_drop_pt: float = 3.0
    min_mirrored: int = 50
    min_z: float = 2.58

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or value < 0:
                raise ConfigError(f"gates.{name} must be a non-negative number, got {value!r}",
                                  hint=_GATES_HINT)
        if self.max_p95_ratio < 1.0:
            raise ConfigError(f"gates.max_p95_ratio must be >= 1, got {self.max_p95_ratio}",
                              hint=_GATES_HINT)
        for name in ("min_feedback", "min_mirrored"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"gates.{name} must be an integer >= 1, got {value!r}",
                                  hint=_GATES_HINT)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gates:
        """Missing fields take the defaults; an unknown field is a ``ConfigError``."""
        if not isinstance(data, Mapping):
            raise ConfigError("gates must be an object", hint=_GATES_HINT)
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"gates: unknown field(s) {', '.join(unknown)}", hint=_GATES_HINT)
        return cls(**data)


class Outcome(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SUSPECT = "suspect"  # beyond the threshold, not (yet) statistically significant
    INSUFFICIENT = "insufficient"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One gate on one window. ``value``: the new version's figure (PSI for the drift
    gate); ``baseline``: the previous version's (None for PSI); ``threshold``: the limit in
    the gate's own unit (points, ratio, PSI); ``n``: the new version's samples behind
    ``value``; ``reason``: the sentence that goes into a transition."""

    gate: str
    outcome: Outcome
    value: float | None
    baseline: float | None
    threshold: float
    n: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "outcome": self.outcome.value, "value": self.value,
                "baseline": self.baseline, "threshold": self.threshold, "n": self.n,
                "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        try:
            return cls(gate=str(data["gate"]), outcome=Outcome(data["outcome"]),
                       value=_opt_float(data.get("value")),
                       baseline=_opt_float(data.get("baseline")),
                       threshold=float(data["threshold"]), n=int(data["n"]),
                       reason=str(data["reason"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"rollout verdict is malformed: {exc!r}",
                              hint="the stored rollout state is damaged") from exc


@dataclass(frozen=True, slots=True)
class Baseline:
    """What the new version is compared with: ``stats`` of the previous version, and a
    ``label`` that says which window it is (empty for the usual same-window baseline)."""

    stats: VersionStats
    label: str = ""


def evaluate(gates: Gates, min_requests: int, new: VersionStats,
             baselines: Sequence[Baseline]) -> tuple[Verdict, ...]:
    """Every gate on ``new`` against the first of ``baselines`` with enough data for it."""
    base = _Picker(baselines)
    by_requests = base.first(lambda s: s.requests, min_requests)
    return (
        _rate_gate(_Rate("error_rate", "error rate", lambda s: s.errors,
                         gates.max_error_rate_delta), gates, min_requests, new, by_requests),
        _p95_gate(gates, min_requests, new, base.first(lambda s: s.timed, min_requests)),
        _rate_gate(_Rate("escalation_rate", "escalation rate", lambda s: s.escalations,
                         gates.max_escalation_delta), gates, min_requests, new, by_requests),
        _psi_gate(gates, min_requests, new, base.first(lambda s: s.answers, min_requests)),
        _accuracy_gate(gates, new, base.first(lambda s: s.feedback, gates.min_feedback)),
        _agreement_gate(gates, new, base.first(lambda s: s.mirrored, gates.min_mirrored)),
    )


def enough_data(min_requests: int, new: VersionStats, baselines: Sequence[Baseline]) -> bool:
    """Whether both sides have ``min_requests`` requests — the condition for a stage to
    pass (optional signals such as feedback may still be short)."""
    return new.requests >= min_requests and any(b.stats.requests >= min_requests
                                                for b in baselines)


class _Picker:
    def __init__(self, baselines: Sequence[Baseline]) -> None:
        self._baselines = list(baselines) or [Baseline(VersionStats())]

    def first(self, size: Callable[[VersionStats], int], minimum: int) -> Baseline:
        """The first baseline with ``size >= minimum``, else the first one."""
        for b in self._baselines:
            if size(b.stats) >= minimum:
                return b
        return self._baselines[0]


def _suffix(base: Baseline) -> str:
    return f" ({base.label})" if base.label else ""


def _short(what: str, n_new: int, n_base: int, minimum: int, unit: str) -> str:
    return (f"{what}: insufficient data ({n_new} {unit} on the new version, {n_base} on "
            f"the baseline; need {minimum} each)")


@dataclass(frozen=True, slots=True)
class _Rate:
    gate: str
    what: str
    count: Callable[[VersionStats], int]  # events out of ``requests``
    max_delta: float


def z_score(x_new: int, n_new: int, x_ref: int, n_ref: int) -> float:
    """One-sided z that the rate ``x_new/n_new`` exceeds ``x_ref/n_ref`` (unpooled standard
    error: with a small baseline rate the pooled one calls 3 errors in 100 significant
    against 0.5%; the unpooled one waits for more)."""
    p_new, p_ref = x_new / n_new, x_ref / n_ref
    se = math.sqrt(p_new * (1 - p_new) / n_new + p_ref * (1 - p_ref) / n_ref)
    delta = p_new - p_ref
    if se == 0:
        return math.inf if delta > 0 else 0.0
    return delta / se


def _judge(beyond: bool, z: float, gates: Gates) -> tuple[Outcome, str]:
    """Outcome and wording of a proportion gate; ``beyond``: past its threshold."""
    if not beyond:
        return Outcome.PASS, "<="
    if z >= gates.min_z:
        return Outcome.FAIL, ">"
    return Outcome.SUSPECT, f"> (not yet significant: z {z:.2f} < {gates.min_z:.2f})"


def _rate_gate(rate: _Rate, gates: Gates, minimum: int, new: VersionStats,
               base: Baseline) -> Verdict:
    n, nb = new.requests, base.stats.requests
    if n < minimum or nb < minimum:
        return Verdict(rate.gate, Outcome.INSUFFICIENT, None, None, rate.max_delta, n,
                       _short(rate.what, n, nb, minimum, "requests"))
    x, xb = rate.count(new), rate.count(base.stats)
    value, ref = x / n, xb / nb
    delta = value - ref
    outcome, op = _judge(delta > rate.max_delta, z_score(x, n, xb, nb), gates)
    reason = (f"{rate.what} {value:.1%} vs {ref:.1%} ({100 * delta:+.1f} pt {op} "
              f"{100 * rate.max_delta:.1f} pt) over {n} requests{_suffix(base)}")
    return Verdict(rate.gate, outcome, value, ref, rate.max_delta, n, reason)


def _p95_gate(gates: Gates, minimum: int, new: VersionStats, base: Baseline) -> Verdict:
    n, nb = new.timed, base.stats.timed
    value, ref = new.quantile_ms(0.95), base.stats.quantile_ms(0.95)
    threshold = gates.max_p95_ratio
    if n < minimum or nb < minimum or value is None or ref is None:
        return Verdict("p95_latency", Outcome.INSUFFICIENT, value, ref, threshold, n,
                       _short("p95 latency", n, nb, minimum, "timed requests"))
    ratio = value / ref if ref > 0 else math.inf
    failed = ratio > threshold and value - ref > gates.min_p95_increase_ms
    reason = (f"p95 latency {value:.1f} ms vs {ref:.1f} ms ({ratio:.2f}x "
              f"{'>' if ratio > threshold else '<='} {threshold:.2f}x, "
              f"{value - ref:+.1f} ms) over {n} requests{_suffix(base)}")
    return Verdict("p95_latency", Outcome.FAIL if failed else Outcome.PASS, value, ref,
                   threshold, n, reason)


def _psi_gate(gates: Gates, minimum: int, new: VersionStats, base: Baseline) -> Verdict:
    n, nb = new.answers, base.stats.answers
    if n < minimum or nb < minimum:
        return Verdict("confidence_psi", Outcome.INSUFFICIENT, None, None, gates.max_psi, n,
                       _short("confidence drift", n, nb, minimum, "answers"))
    expected, actual = merge_sparse(base.stats.confidence_buckets, new.confidence_buckets)
    if len(expected) < 2:
        return Verdict("confidence_psi", Outcome.PASS, 0.0, None, gates.max_psi, n,
                       f"confidence drift: every answer in one bin over {n} vs {nb} answers"
                       f"{_suffix(base)}")
    value = psi(expected, actual)
    reading = "significant shift" if value > 0.25 else "moderate" if value >= 0.1 \
        else "stable"
    critical = psi_critical(gates.min_z, len(expected) - 1, n, nb)
    outcome, op = _judge(value > gates.max_psi, math.inf if value > critical else 0.0, gates)
    if outcome is Outcome.SUSPECT:
        op = f"> (not yet significant: {critical:.3f} needed over this many answers)"
    reason = (f"confidence drift PSI {value:.3f} {op} {gates.max_psi:.3f} ({reading}) over "
              f"{n} vs {nb} answers{_suffix(base)}")
    return Verdict("confidence_psi", outcome, value, None, gates.max_psi, n, reason)


def psi_critical(z: float, dof: int, n: int, nb: int) -> float:
    """The PSI two same-distribution samples of ``n`` and ``nb`` answers exceed with
    one-sided probability ``z`` (the gates' ``min_z``): ``PSI * n * nb / (n + nb)`` is about
    chi-square with ``dof`` degrees of freedom (bins - 1), whose quantile is taken by
    Wilson-Hilferty. Over 115 answers a side it is ~0.41 (noise alone passes 0.25 often);
    over 400, ~0.12."""
    k = float(dof)
    quantile = k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
    return quantile * (n + nb) / (n * nb)


@dataclass(frozen=True, slots=True)
class _Share:
    """A gate on the share of ``total`` samples that were ``hits`` (answers found right,
    mirrored samples agreed with): fails on a drop of more than ``max_drop_pt`` points."""

    gate: str
    what: str
    unit: str  # of the samples, in the reason
    short_unit: str  # ...and when there are too few
    total: Callable[[VersionStats], int]
    hits: Callable[[VersionStats], int]
    max_drop_pt: float
    minimum: int


def _drop_gate(share: _Share, gates: Gates, new: VersionStats, base: Baseline) -> Verdict:
    n, nb = share.total(new), share.total(base.stats)
    threshold = share.max_drop_pt
    if n < share.minimum or nb < share.minimum:
        return Verdict(share.gate, Outcome.INSUFFICIENT,
                       share.hits(new) / n if n else None,
                       share.hits(base.stats) / nb if nb else None, threshold, n,
                       _short(share.what, n, nb, share.minimum, share.short_unit))
    hits, hits_b = share.hits(new), share.hits(base.stats)
    value, ref = hits / n, hits_b / nb
    drop = 100 * (ref - value)
    outcome, op = _judge(drop > threshold, z_score(n - hits, n, nb - hits_b, nb), gates)
    reason = (f"{share.what} {value:.1%} vs {ref:.1%} ({-drop:+.1f} pt, drop {op} "
              f"{threshold:.1f} pt) over {n} {share.unit}{_suffix(base)}")
    return Verdict(share.gate, outcome, value, ref, threshold, n, reason)


def _accuracy_gate(gates: Gates, new: VersionStats, base: Baseline) -> Verdict:
    return _drop_gate(_Share("feedback_accuracy", "accuracy on labelled feedback", "answers",
                             "labelled answers", lambda s: s.feedback,
                             lambda s: s.feedback_correct, gates.max_accuracy_drop_pt,
                             gates.min_feedback), gates, new, base)


def _agreement_gate(gates: Gates, new: VersionStats, base: Baseline) -> Verdict:
    return _drop_gate(_Share("agreement", "agreement with the most capable model",
                             "mirrored samples", "mirrored samples", lambda s: s.mirrored,
                             lambda s: s.agreed, gates.max_agreement_drop_pt,
                             gates.min_mirrored), gates, new, base)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
