"""Routers judged the way the field judges them (RouteLLM; pure numpy, no I/O).

A router gives every prompt a score (higher: the large model is likelier needed). Sending
the share ``s`` of prompts with the highest scores to the large model and the rest to the
small one gives a quality ``q(s)``; ``q(0)`` is the small model's, ``q(1)`` the large one's.
The **performance gap recovered** ``PGR(s) = (q(s) − q_small) / (q_large − q_small)``; its
mean over ``s`` in [0, 1] is the **APGR**; ``CPT(x)`` is the smallest share of large-model
calls at which ``PGR ≥ x`` (CPT(50%): what recovering half of the gap costs).

Two references bound every router: ``random`` (each prompt to the large model with
probability ``s``: ``PGR(s) = s``, APGR 0.5) and ``oracle`` (the prompts only the large
model gets right go first, those only the small model gets right last). A kNN router over
the same features is the neutral baseline learned routers are held against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tierlink.errors import ConfigError

__all__ = ["SHARES", "Curve", "apgr_interval", "curve", "knn_scores", "oracle_scores",
           "random_curve"]

SHARES = np.linspace(0.0, 1.0, 101)  # the shares of large-model calls a curve is read at
CPT_LEVELS = (50, 80, 95)


@dataclass(frozen=True, slots=True)
class Curve:
    """Quality and PGR at each share of :data:`SHARES`; APGR and CPT at 50, 80 and 95%."""

    shares: np.ndarray
    quality: np.ndarray
    pgr: np.ndarray

    @property
    def apgr(self) -> float:
        return float(self.pgr.mean())

    def cpt(self, level: float) -> float | None:
        """The smallest share with PGR ≥ ``level`` (0–1); None when never reached."""
        reached = np.flatnonzero(self.pgr >= level - 1e-12)
        return float(self.shares[reached[0]]) if reached.size else None

    def figures(self) -> dict[str, Any]:
        return {"apgr": round(self.apgr, 4),
                **{f"cpt{level}": _rounded(self.cpt(level / 100)) for level in CPT_LEVELS}}


def curve(scores: np.ndarray, small_right: np.ndarray, large_right: np.ndarray,
          shares: np.ndarray = SHARES) -> Curve:
    """``scores``' curve on prompts the small and the large model got right or wrong; ties
    go to the large model in the prompts' order."""
    small, large = _checked(small_right, large_right)
    if len(scores) != len(small):
        raise ConfigError(f"{len(scores)} scores for {len(small)} prompts")
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    gain = (large.astype(np.int64) - small.astype(np.int64))[order]
    sent = np.concatenate([[0], np.cumsum(gain)])  # right answers gained, first k sent up
    k = np.rint(shares * len(small)).astype(np.int64)
    quality = small.mean() + sent[k] / len(small)
    return Curve(shares, quality, _pgr(quality, small, large))


def apgr_interval(scores: np.ndarray, small_right: np.ndarray, large_right: np.ndarray,
                  rng: np.random.Generator, rounds: int = 200, level: float = 0.95
                  ) -> tuple[float, float]:
    """A bootstrap interval of ``scores``' APGR above random's (the prompts resampled with
    replacement; random's APGR is 0.5 on every resample)."""
    small, large = _checked(small_right, large_right)
    n, gains = len(small), []
    for _ in range(rounds):
        pick = rng.integers(0, n, n)
        if small[pick].mean() == large[pick].mean():
            continue
        gains.append(curve(np.asarray(scores)[pick], small[pick], large[pick]).apgr - 0.5)
    if not gains:
        raise ConfigError("no resample of these prompts has a gap between the models")
    tail = (1.0 - level) / 2
    return float(np.quantile(gains, tail)), float(np.quantile(gains, 1.0 - tail))


def random_curve(small_right: np.ndarray, large_right: np.ndarray,
                 shares: np.ndarray = SHARES) -> Curve:
    """Routing at random: the expected quality at each share (``PGR(s) = s``)."""
    small, large = _checked(small_right, large_right)
    quality = (1.0 - shares) * small.mean() + shares * large.mean()
    return Curve(shares, quality, _pgr(quality, small, large))


def oracle_scores(small_right: np.ndarray, large_right: np.ndarray) -> np.ndarray:
    """What an oracle sends first: only the large model right (1), both or neither (0),
    only the small model right (−1)."""
    small, large = _checked(small_right, large_right)
    return large.astype(np.float64) - small.astype(np.float64)


def knn_scores(train_x: np.ndarray, train_y: np.ndarray, x: np.ndarray, k: int = 15
               ) -> np.ndarray:
    """The share of each row's ``k`` nearest training rows (cosine) that needed the large
    model."""
    if not 0 < k <= len(train_x):
        raise ConfigError(f"k must be in 1..{len(train_x)}, got {k}")
    a = _unit(np.asarray(train_x, dtype=np.float64))
    b = _unit(np.atleast_2d(np.asarray(x, dtype=np.float64)))
    nearest = np.argpartition(-(b @ a.T), k - 1, axis=1)[:, :k]
    return np.asarray(train_y, dtype=np.float64)[nearest].mean(axis=1)


def _checked(small_right: np.ndarray, large_right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    small, large = np.asarray(small_right, dtype=bool), np.asarray(large_right, dtype=bool)
    if small.shape != large.shape or small.ndim != 1 or not small.size:
        raise ConfigError("the small and the large model's answers must cover the same "
                          f"prompts (got {small.shape} and {large.shape})")
    if small.mean() == large.mean():
        raise ConfigError("the two models are equally good on these prompts: there is no "
                          "gap for a router to recover")
    return small, large


def _pgr(quality: np.ndarray, small: np.ndarray, large: np.ndarray) -> np.ndarray:
    return np.asarray((quality - small.mean()) / (large.mean() - small.mean()))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
