"""Evaluate and tune cascade thresholds on held-out data. Pure numpy, no I/O.

A cascade of ``k`` stages has ``k - 1`` thresholds: stage ``i`` answers an input that no
earlier stage answered when its confidence is at least ``thresholds[i]``; the last stage
answers everything left. A request pays the cost of every stage it reaches.

:func:`tune` picks thresholds on the calibration split for one :class:`Target`:

* ``accuracy_floor``: among settings whose accuracy is at least the floor, the one that
  escalates fewest inputs past the device (``prefer="device"``, the default: the device
  answers everything it is sure enough of, which also keeps inputs and latency local), and
  among those the cheapest; ``prefer="cost"`` takes the cheapest setting outright (which,
  with a near-free edge, may send more to the edge than needed);
* ``escalation_budget``: the most accurate setting that escalates at most that share of
  inputs past the first stage;
* ``cost_ceiling``: the most accurate setting whose mean cost per request is at most the
  ceiling (USD).

Ties go to the more accurate, then the cheaper setting. When nothing meets the target the
result says so (``feasible`` False) and carries the setting closest to it. Thresholds are
searched over quantiles of each stage's confidence, with the last free threshold scored
for all its candidates at once (sorted cumulative sums), so a three-stage cascade over
5,000 inputs tunes in well under a second.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from tierlink.core.types import Tier
from tierlink.errors import ConfigError

QUANTILES = 201  # candidate thresholds per stage: confidence quantiles, plus 0 and 1


@dataclass(frozen=True, slots=True)
class Stage:
    """One model of a cascade on one dataset split.

    ``confidence`` (N,): its calibrated max-softmax probability per input; ``correct``
    (N,) bool: whether its top-1 answer is right; ``cost``: USD per request that reaches
    this stage (compute plus any transfer into its tier)."""

    model: str
    tier: Tier
    confidence: np.ndarray
    correct: np.ndarray
    cost: float


@dataclass(frozen=True, slots=True)
class Operating:
    """What a threshold setting does on a split: accuracy, mean cost per request (USD)
    and the share of inputs each stage answers (sums to 1)."""

    thresholds: tuple[float, ...]
    accuracy: float
    cost: float
    shares: tuple[float, ...]

    @property
    def escalated(self) -> float:
        """Share of inputs the first stage passes on."""
        return 1.0 - self.shares[0]

    def to_dict(self) -> dict[str, object]:
        return {"thresholds": list(self.thresholds), "accuracy": self.accuracy,
                "cost_per_1k": 1000.0 * self.cost, "shares": list(self.shares),
                "escalated": self.escalated}


class TargetKind(str, Enum):
    ACCURACY_FLOOR = "accuracy_floor"
    ESCALATION_BUDGET = "escalation_budget"
    COST_CEILING = "cost_ceiling"


@dataclass(frozen=True, slots=True)
class Target:
    """What the thresholds should achieve; ``value`` is absolute: accuracy in 0..1, a share
    of inputs in 0..1, or USD per request."""

    kind: TargetKind
    value: float
    prefer: str = "device"  # accuracy_floor only: "device" (fewest escalations) or "cost"

    def __post_init__(self) -> None:
        if self.prefer not in ("device", "cost"):
            raise ConfigError(f"prefer must be 'device' or 'cost', got {self.prefer!r}")

    def describe(self) -> str:
        if self.kind is TargetKind.ACCURACY_FLOOR:
            how = "fewest escalations" if self.prefer == "device" else "lowest cost"
            return f"accuracy >= {100 * self.value:.2f}%, {how}"
        if self.kind is TargetKind.ESCALATION_BUDGET:
            return f"escalate <= {100 * self.value:.1f}% of inputs, most accurate"
        return f"cost <= ${1000 * self.value:.6f} per 1k requests, most accurate"


@dataclass(frozen=True, slots=True)
class Tuning:
    """The chosen thresholds and what they do on the split they were tuned on."""

    target: Target
    chosen: Operating
    feasible: bool


def check_stages(stages: Sequence[Stage]) -> int:
    """The number of inputs; ``ConfigError`` if the stages disagree or are too few."""
    if len(stages) < 2:
        raise ConfigError("a cascade needs at least two stages",
                          hint="give a device model and at least one upstream model")
    n = len(stages[0].correct)
    for s in stages:
        if s.confidence.shape != (n,) or s.correct.shape != (n,):
            raise ConfigError(f"stage {s.model}: confidence {s.confidence.shape} and correct "
                              f"{s.correct.shape} must both be ({n},)")
    if n == 0:
        raise ConfigError("cannot tune a cascade on an empty split")
    return n


def answering_stage(stages: Sequence[Stage], thresholds: Sequence[float]) -> np.ndarray:
    """(N,) index of the stage that answers each input."""
    n = check_stages(stages)
    _check_thresholds(stages, thresholds)
    out = np.full(n, len(stages) - 1)
    open_ = np.ones(n, dtype=bool)
    for i, t in enumerate(thresholds):
        take = open_ & (stages[i].confidence >= t)
        out[take] = i
        open_ &= ~take
    return out


def evaluate(stages: Sequence[Stage], thresholds: Sequence[float]) -> Operating:
    """Accuracy, cost and shares of the cascade at ``thresholds``."""
    at = answering_stage(stages, thresholds)
    return _operating(stages, tuple(float(t) for t in thresholds), at,
                      answers_correct(stages, at))


def evaluate_assignment(stages: Sequence[Stage], at: np.ndarray) -> Operating:
    """Like :func:`evaluate` for any assignment of inputs to answering stages (e.g. random
    escalation, the baseline a confidence signal must beat)."""
    check_stages(stages)
    return _operating(stages, (), at, answers_correct(stages, at))


def answers_correct(stages: Sequence[Stage], at: np.ndarray) -> np.ndarray:
    """(N,) whether each input's answer is right when stage ``at[i]`` answers input i."""
    return np.stack([s.correct for s in stages])[at, np.arange(len(at))]


def _operating(stages: Sequence[Stage], thresholds: tuple[float, ...], at: np.ndarray,
               correct: np.ndarray) -> Operating:
    path_cost = np.cumsum([s.cost for s in stages])  # cost of being answered at stage i
    shares = np.bincount(at, minlength=len(stages)) / len(at)
    return Operating(thresholds, float(correct.mean()), float(path_cost[at].mean()),
                     tuple(float(x) for x in shares))


def single(stages: Sequence[Stage], index: int) -> Operating:
    """Stage ``index`` answering everything on its own (paying only its own cost)."""
    s = stages[index]
    shares = tuple(1.0 if i == index else 0.0 for i in range(len(stages)))
    return Operating((), float(s.correct.mean()), s.cost, shares)


def candidates(confidence: np.ndarray, count: int = QUANTILES) -> np.ndarray:
    """Candidate thresholds for one stage: quantiles of its confidence, plus 0 (answer
    everything) and 1 (answer only certainties), ascending and unique."""
    qs = np.quantile(confidence, np.linspace(0.0, 1.0, count))
    return np.unique(np.concatenate([[0.0, 1.0], np.round(qs, 4)]))


def tune(stages: Sequence[Stage], target: Target, count: int = QUANTILES) -> Tuning:
    """The thresholds that best meet ``target`` on ``stages`` (see the module docstring)."""
    n = check_stages(stages)
    grids = [candidates(s.confidence, count) for s in stages[:-1]]
    best: tuple[tuple[float, ...], float, float, float] | None = None  # (ts, acc, cost, esc)
    for prefix in itertools.product(*grids[:-1]):
        for ts, acc, cost, esc in _last_scan(stages, prefix, grids[-1], n):
            if best is None or _better(target, (acc, cost, esc), best[1:]):
                best = (ts, acc, cost, esc)
    assert best is not None
    chosen = evaluate(stages, best[0])
    return Tuning(target, chosen, _meets(target, chosen.accuracy, chosen.cost,
                                         chosen.escalated))


def _last_scan(stages: Sequence[Stage], prefix: tuple[float, ...], grid: np.ndarray,
               n: int) -> list[tuple[tuple[float, ...], float, float, float]]:
    """Every candidate of the last free threshold, given the earlier ones, at once."""
    open_ = np.ones(n, dtype=bool)
    fixed_correct, fixed_cost, first = 0.0, 0.0, 0
    path_cost = np.cumsum([s.cost for s in stages])
    for i, t in enumerate(prefix):
        take = open_ & (stages[i].confidence >= t)
        first = first if i else int(take.sum())
        fixed_correct += float(stages[i].correct[take].sum())
        fixed_cost += float(take.sum()) * path_cost[i]
        open_ &= ~take
    j = len(prefix)  # the stage whose threshold is scanned; j + 1 is the last stage
    conf = stages[j].confidence[open_]
    order = np.argsort(-conf, kind="stable")
    conf_sorted = conf[order]
    here = np.concatenate([[0], np.cumsum(stages[j].correct[open_][order])])
    last = np.concatenate([[0], np.cumsum(stages[j + 1].correct[open_][order])])
    m = len(conf)
    # k(t) = how many open inputs stage j answers at threshold t (confidence >= t).
    k = np.searchsorted(-conf_sorted, -grid, side="right")
    acc = (fixed_correct + here[k] + (last[m] - last[k])) / n
    cost = (fixed_cost + k * path_cost[j] + (m - k) * path_cost[j + 1]) / n
    esc = np.broadcast_to(1.0 - ((k if j == 0 else first) / n), grid.shape)
    return [((*prefix, float(t)), float(a), float(c), float(e))
            for t, a, c, e in zip(grid, acc, cost, esc, strict=True)]


def _meets(target: Target, acc: float, cost: float, esc: float) -> bool:
    eps = 1e-12
    if target.kind is TargetKind.ACCURACY_FLOOR:
        return acc >= target.value - eps
    if target.kind is TargetKind.ESCALATION_BUDGET:
        return esc <= target.value + eps
    return cost <= target.value + eps


def _better(target: Target, new: tuple[float, float, float],
            old: tuple[float, float, float]) -> bool:
    """Is ``new`` (accuracy, cost, escalated) a better answer to ``target`` than ``old``?"""
    ok_new, ok_old = _meets(target, *new), _meets(target, *old)
    if ok_new != ok_old:
        return ok_new
    if not ok_new:  # neither meets it: the closer one
        return _shortfall(target, new) < _shortfall(target, old)
    if target.kind is TargetKind.ACCURACY_FLOOR and target.prefer == "device":
        return (new[2], new[1], -new[0]) < (old[2], old[1], -old[0])
    if target.kind is TargetKind.ACCURACY_FLOOR:
        return (new[1], -new[0]) < (old[1], -old[0])
    return (-new[0], new[1]) < (-old[0], old[1])


def _shortfall(target: Target, point: tuple[float, float, float]) -> float:
    acc, cost, esc = point
    if target.kind is TargetKind.ACCURACY_FLOOR:
        return target.value - acc
    if target.kind is TargetKind.ESCALATION_BUDGET:
        return esc - target.value
    return cost - target.value


def _check_thresholds(stages: Sequence[Stage], thresholds: Sequence[float]) -> None:
    if len(thresholds) != len(stages) - 1:
        raise ConfigError(f"a {len(stages)}-stage cascade takes {len(stages) - 1} "
                          f"threshold(s), got {len(thresholds)}")
    bad = [t for t in thresholds if not 0.0 <= t <= 1.0]
    if bad:
        raise ConfigError(f"thresholds must lie in [0, 1], got {bad}")
