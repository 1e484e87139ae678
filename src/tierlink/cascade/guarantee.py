"""Cascade thresholds whose accuracy target holds on unseen data with a stated confidence.
Pure numpy, no I/O.

The fewest escalations that *just* meet a target on the calibration split are a coin toss on
the next sample: half the time the target is missed. Picking, among thousands of settings,
the cheapest one that passes a statistical test is hardly better: the test's error is spent
once per setting, and the winner is the one whose noise was kindest. So
:func:`tune_guaranteed` follows Learn-then-Test's *fixed sequence* (Angelopoulos et al.,
2021): one confidence bar for the whole cascade — every stage but the last answers when
its calibrated confidence reaches the bar (calibrated: the same bar means the same expected
accuracy at every stage) — lowered along a grid fixed in advance, from 1.0 (everything to
the top stage) down, each bar tested in turn; the first failure stops the walk, and the last
bar that passed is chosen.

Each bar is tested exactly, at any sample size:

* **relative** (``drop``): "accuracy >= the top stage's - ``drop``". Per input the loss is
  ``L = [cascade wrong] - [top stage wrong]`` in {-1, 0, 1} (paired: both answer the same
  inputs, so most inputs cost nothing either way). The statistic ``n+ - n-`` (inputs the
  cascade loses minus those it wins) has a trinomial law fixed by the mean loss and the
  discordance rate ``p+ + p-``; that nuisance is replaced by its ``1 - GAMMA``
  Clopper-Pearson upper bound and ``GAMMA`` is added to the p-value (Berger and Boos, 1994).
  Without ``batch`` the null hypothesis is ``E[L] > drop``. With ``batch`` the promise is
  about any ``batch`` requests — what a user checks on a held-out set is such a batch: the
  expected loss must stay ``margin`` below ``drop`` (tested at half the error budget), where
  a batch rises above its expected loss by more than ``margin`` with at most the other
  half's probability (the same trinomial law, at the discordance rate's upper bound).
* **absolute** (``floor``): "accuracy >= ``floor``", with the exact binomial tail (the
  Clopper-Pearson lower bound on the cascade's accuracy).

A bar passes when its p-value is at most ``1 - confidence``. ``benchmarks/cascade.py``
measures the share of random calibration/test splits on which the target then holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tierlink.cascade.tune import (
    Operating,
    Stage,
    answering_stage,
    answers_correct,
    check_stages,
    evaluate,
)
from tierlink.errors import ConfigError

GAMMA = 1e-3  # share of the error budget spent on bounding the discordance rate
BAR_STEP = 0.0025  # the confidence bars tried: 1.0, 0.9975, ... (a fixed grid)
_TAIL_SDS = 12.0  # the trinomial grid covers the mean +- this many standard deviations


@dataclass(frozen=True, slots=True)
class Guarantee:
    """What the chosen thresholds promise. ``drop`` (relative) or ``floor`` (absolute),
    in 0..1; ``confidence`` in (0, 1). ``bound``: the loss (relative: points below the
    top stage as a fraction; absolute: the accuracy's lower bound) that the calibration
    records support at that confidence for the chosen setting."""

    confidence: float
    drop: float | None = None
    floor: float | None = None
    bound: float | None = None
    samples: int = 0
    batch: int | None = None  # the guarantee speaks of a batch this large (None: the mean)

    def describe(self) -> str:
        conf = f"{100 * self.confidence:g}% confidence"
        if self.batch:
            conf += f" on any {self.batch:,} requests"
        if self.drop is not None:
            text = f"accuracy >= top stage - {100 * self.drop:.2f} pt with {conf}"
            if self.bound is not None:
                text += f" (bound reached: top - {100 * self.bound:.2f} pt"
                text += f" over {self.samples} calibration records)"
            return text
        text = f"accuracy >= {100 * (self.floor or 0.0):.2f}% with {conf}"
        if self.bound is not None:
            text += f" (bound reached: {100 * self.bound:.2f}% over {self.samples} records)"
        return text

    def to_dict(self) -> dict[str, object]:
        return {"confidence": self.confidence, "drop": self.drop, "floor": self.floor,
                "bound": self.bound, "samples": self.samples, "batch": self.batch,
                "text": self.describe()}


@dataclass(frozen=True, slots=True)
class GuaranteedTuning:
    chosen: Operating
    guarantee: Guarantee
    feasible: bool


def bar_grid(step: float = BAR_STEP) -> np.ndarray:
    """The confidence bars tried, most cautious first: 1.0 (everything to the top stage)
    down to ``step`` — fixed in advance, never drawn from the data."""
    return np.round(np.arange(1.0, 0.0, -step), 6)


def tune_guaranteed(stages: Sequence[Stage], confidence: float, *, drop: float | None = None,
                    floor: float | None = None, batch: int | None = None,
                    step: float = BAR_STEP) -> GuaranteedTuning:
    """One confidence bar for the whole cascade (every stage but the last answers when its
    calibrated confidence reaches it), lowered along a fixed grid while the target passes
    the finite-sample test; the last bar that passed (module doc). Infeasible (even the
    most cautious bar fails): everything to the top stage, ``feasible`` False."""
    n = check_stages(stages)
    _check(confidence, drop, floor)
    delta = 1.0 - confidence
    top = stages[-1].correct
    chosen: tuple[float, ...] | None = None
    for bar in bar_grid(step):
        ts = tuple(float(bar) for _ in stages[:-1])
        correct = _answers(stages, ts)
        if drop is not None:
            lost, won = int((~correct & top).sum()), int((correct & ~top).sum())
            passed = _passes(n, lost, won, drop, batch, delta)
        else:
            k = int(correct.sum())
            passed = k / n >= (floor or 0.0) and absolute_p_value(n, k, floor or 0.0) <= delta
        if not passed:
            break
        chosen = ts
    feasible = chosen is not None
    ts = chosen if chosen is not None else tuple(1.0 for _ in stages[:-1])
    return GuaranteedTuning(evaluate(stages, ts),
                            _reached(stages, ts, confidence, drop, floor, batch), feasible)


def _answers(stages: Sequence[Stage], thresholds: Sequence[float]) -> np.ndarray:
    """(N,) whether the cascade's answer is right at ``thresholds``."""
    return answers_correct(stages, answering_stage(stages, thresholds))


def _check(confidence: float, drop: float | None, floor: float | None) -> None:
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must lie in (0, 1), got {confidence}")
    if (drop is None) == (floor is None):
        raise ConfigError("a guaranteed target is either a drop below the top stage or an "
                          "absolute accuracy floor")
    if drop is not None and not 0.0 <= drop < 1.0:
        raise ConfigError(f"the accuracy drop must lie in [0, 1), got {drop}")
    if floor is not None and not 0.0 <= floor <= 1.0:
        raise ConfigError(f"the accuracy floor must lie in [0, 1], got {floor}")


def _passes(n: int, lost: int, won: int, drop: float, batch: int | None,
            delta: float) -> bool:
    if batch:
        return batch_passes(n, lost, won, drop, batch, delta)
    return (lost - won) / n <= drop and relative_p_value(n, lost, won, drop) <= delta


def _reached(stages: Sequence[Stage], thresholds: Sequence[float], confidence: float,
             drop: float | None, floor: float | None, batch: int | None) -> Guarantee:
    """The guarantee with the bound the records support for ``thresholds``."""
    n = len(stages[0].correct)
    correct = _answers(stages, thresholds)
    if drop is not None:
        top = stages[-1].correct
        lost, won = int((~correct & top).sum()), int((correct & ~top).sum())
        return Guarantee(confidence, drop=drop, samples=n, batch=batch,
                         bound=relative_bound(n, lost, won, confidence, batch))
    return Guarantee(confidence, floor=floor, samples=n, batch=batch,
                     bound=accuracy_lower_bound(n, int(correct.sum()), confidence))


# -- the tests ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def relative_p_value(n: int, lost: int, won: int, drop: float) -> float:
    """p-value of ``E[L] > drop`` given ``lost`` (L = 1) and ``won`` (L = -1) of ``n``."""
    nu = _upper_rate(n, lost + won, GAMMA)  # the discordance rate's upper bound
    nu = max(nu, abs(drop) + 1e-12)
    p_lose, p_win = (nu + drop) / 2.0, (nu - drop) / 2.0
    if p_lose >= 1.0:
        return 1.0
    return min(1.0, _trinomial_cdf(n, p_lose, p_win, lost - won) + GAMMA)


@functools.lru_cache(maxsize=4096)
def batch_margin(n: int, lost: int, won: int, drop: float, batch: int, delta: float) -> float:
    """How far a batch's mean loss may rise above the expected loss: the ``1 - delta``
    quantile of (batch mean - expected) under the trinomial law at the boundary (expected
    loss ``drop``) and the discordance rate's ``1 - GAMMA`` upper bound from the
    calibration records (a larger rate only widens the law)."""
    nu = max(_upper_rate(n, lost + won, GAMMA), abs(drop) + 1e-12)
    values, mass = _difference_law(batch, (nu + drop) / 2.0, (nu - drop) / 2.0)
    above = np.cumsum(mass[::-1])[::-1]  # P(D >= value)
    k = int(np.argmax(above <= delta)) if (above <= delta).any() else len(values) - 1
    return max(0.0, float(values[k]) / batch - drop)


def batch_passes(n: int, lost: int, won: int, drop: float, batch: int, delta: float) -> bool:
    """Whether "loss <= ``drop`` on a batch of ``batch`` requests" holds with probability
    ``1 - delta``: the expected loss is at most ``drop - margin`` with probability
    ``1 - delta / 2`` (:func:`relative_p_value`), and a batch rises above its expected loss
    by more than that margin with probability at most ``delta / 2``
    (:func:`batch_margin`; the union bound adds the two)."""
    margin = batch_margin(n, lost, won, drop, batch, delta / 2.0)
    room = drop - margin
    return (lost - won) / n <= room and relative_p_value(n, lost, won, room) <= delta / 2.0


def relative_bound(n: int, lost: int, won: int, confidence: float,
                   batch: int | None = None) -> float:
    """The least drop the test supports at ``confidence``: the loss's upper bound (the
    p-value falls as the drop grows; at the point estimate it is about one half)."""
    lo, hi = (lost - won) / n, 0.5
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if _passes(n, lost, won, mid, batch, 1.0 - confidence):
            hi = mid
        else:
            lo = mid
    return hi


def absolute_p_value(n: int, correct: int, floor: float) -> float:
    """p-value of "accuracy < ``floor``" given ``correct`` of ``n``: P(X >= correct)."""
    if floor <= 0.0:
        return 0.0
    k = np.arange(correct, n + 1)
    return float(np.exp(_binom_logpmf(n, k, floor)).sum())


def accuracy_lower_bound(n: int, correct: int, confidence: float) -> float:
    """Clopper-Pearson lower bound on the accuracy."""
    lo, hi = 0.0, correct / n
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if absolute_p_value(n, correct, mid) <= 1.0 - confidence:
            lo = mid
        else:
            hi = mid
    return lo


@functools.lru_cache(maxsize=4096)
def _upper_rate(n: int, k: int, gamma: float) -> float:
    """Clopper-Pearson upper bound (one-sided, level ``1 - gamma``) of a rate ``k / n``."""
    lo, hi = k / n, 1.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        below = float(np.exp(_binom_logpmf(n, np.arange(0, k + 1), mid)).sum())
        if below > gamma:
            lo = mid
        else:
            hi = mid
    return hi


def _trinomial_cdf(n: int, p_lose: float, p_win: float, t: int) -> float:
    """P(n+ - n- <= t) for (n+, n-) ~ Multinomial(n; p_lose, p_win, rest)."""
    values, mass = _difference_law(n, p_lose, p_win)
    return float(mass[values <= t].sum())


def _difference_law(n: int, p_lose: float, p_win: float) -> tuple[np.ndarray, np.ndarray]:
    """The law of n+ - n- for (n+, n-) ~ Multinomial(n; p_lose, p_win, rest): its values
    and their probabilities (the grid covers all but a negligible tail). The sum of n
    trials of (+1, -1, 0) is the n-th power of one trial's characteristic function: one
    FFT over a grid twice the support (no wrap-around), where the direct sum over
    (n+, n-) pairs costs the support squared."""
    sd = math.sqrt(n * max(p_lose, p_win, 1e-12))
    kmax = min(n, int(n * max(p_lose, p_win) + _TAIL_SDS * sd + 10))
    size = 1 << (2 * (2 * kmax + 1) - 1).bit_length()
    w = 2.0 * np.pi * np.fft.fftfreq(size)
    phi = (1.0 - p_lose - p_win) + p_lose * np.exp(-1j * w) + p_win * np.exp(1j * w)
    pmf = np.fft.ifft(phi ** n).real
    values = np.arange(-kmax, kmax + 1)
    return values, np.clip(pmf[values % size], 0.0, None)


def _binom_logpmf(n: int, k: np.ndarray, p: float) -> np.ndarray:
    logf = _log_factorials(n)
    if p <= 0.0:
        return np.where(k == 0, 0.0, -np.inf)
    if p >= 1.0:
        return np.where(k == n, 0.0, -np.inf)
    return logf[n] - logf[k] - logf[n - k] + k * math.log(p) + (n - k) * math.log1p(-p)


_LOGF = np.zeros(1)  # log k! for k = 0 .. len - 1, grown as larger n are asked for


def _log_factorials(n: int) -> np.ndarray:
    global _LOGF
    if len(_LOGF) <= n:
        _LOGF = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    return _LOGF
