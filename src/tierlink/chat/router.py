"""Routing chat by difficulty: which prompts need the large model (pure numpy, no I/O).

In the spirit of RouteLLM's classifiers, but reading what the device already has: the small
model's final hidden state of the prompt, computed while the device prefills it (for its own
answer or to draft). A logistic regression on those features estimates P(the large model is
needed) — trained on labelled prompts where the large model is right and the small one wrong.
Prompts scoring above the threshold go to the large model. The threshold is tuned like a
cascade's (``cascade/tune.py``): the small stage's "confidence" is ``1 − score``, so a quality
target ("within 1 point of the large model") or a budget of large-model calls picks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierlink.cascade.tune import Stage, Target, Tuning, tune
from tierlink.core.types import Tier
from tierlink.errors import ConfigError


@dataclass(frozen=True, slots=True)
class DifficultyRouter:
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float
    threshold: float = 0.5

    def scores(self, features: np.ndarray) -> np.ndarray:
        """P(large needed) per row of ``features`` (N, hidden)."""
        z = ((np.atleast_2d(features) - self.mean) / self.scale) @ self.weights + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))

    def to_large(self, features: np.ndarray) -> bool:
        return bool(self.scores(features)[0] > self.threshold)

    def with_threshold(self, threshold: float) -> DifficultyRouter:
        return DifficultyRouter(self.mean, self.scale, self.weights, self.bias, threshold)

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "weights": self.weights.tolist(), "bias": self.bias,
                "threshold": self.threshold}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DifficultyRouter:
        try:
            return cls(np.asarray(raw["mean"], dtype=np.float64),
                       np.asarray(raw["scale"], dtype=np.float64),
                       np.asarray(raw["weights"], dtype=np.float64), float(raw["bias"]),
                       float(raw.get("threshold", 0.5)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a difficulty router: {exc}") from None


def load_router(path: str) -> DifficultyRouter:
    import json
    from pathlib import Path

    try:
        return DifficultyRouter.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the difficulty router {path}: {exc}",
                          hint="write one with tierlink cascade chat-router") from exc


def needs_large(small_right: np.ndarray, large_right: np.ndarray) -> np.ndarray:
    """The training target: the large model right where the small one is wrong."""
    return (~small_right.astype(bool)) & large_right.astype(bool)


def fit(features: np.ndarray, target: np.ndarray, l2: float = 10.0,
        iterations: int = 25) -> DifficultyRouter:
    """L2-regularised logistic regression by Newton's method on standardised features."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y) or len(x) < 10:
        raise ConfigError("a router needs (N, features) with N >= 10 and one target per row")
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    xs = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(xs.shape[1])
    ridge = l2 * np.eye(xs.shape[1])
    ridge[-1, -1] = 0.0  # the bias is not shrunk
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(xs @ w, -40, 40)))
        grad = xs.T @ (p - y) + ridge @ w
        hess = (xs * (p * (1 - p))[:, None]).T @ xs + ridge
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return DifficultyRouter(mean, scale, w[:-1], float(w[-1]))


def stages(router: DifficultyRouter, features: np.ndarray, small_right: np.ndarray,
           large_right: np.ndarray, costs: Sequence[float] = (0.0, 1.0),
           names: Sequence[str] = ("small", "large")) -> list[Stage]:
    """The routed pair as a two-stage cascade the tuner understands."""
    conf = 1.0 - router.scores(features)
    return [Stage(names[0], Tier.DEVICE, conf, small_right.astype(bool), costs[0]),
            Stage(names[1], Tier.CLOUD, np.ones(len(conf)), large_right.astype(bool),
                  costs[1])]


def tune_router(router: DifficultyRouter, features: np.ndarray, small_right: np.ndarray,
                large_right: np.ndarray, target: Target) -> tuple[DifficultyRouter, Tuning]:
    """The threshold for ``target`` on a calibration split (held out from training)."""
    tuning = tune(stages(router, features, small_right, large_right), target)
    bar = tuning.chosen.thresholds[0]  # small answers when 1 - score >= bar
    return router.with_threshold(1.0 - bar), tuning


def routed_quality(router: DifficultyRouter, features: np.ndarray, small_right: np.ndarray,
                   large_right: np.ndarray) -> dict[str, float]:
    """Accuracy of the routed mix and its share of large-model calls on a split."""
    to_large = router.scores(features) > router.threshold
    right = np.where(to_large, large_right, small_right)
    return {"accuracy": float(right.mean()), "large_share": float(to_large.mean()),
            "small_accuracy": float(small_right.mean()),
            "large_accuracy": float(large_right.mean())}
