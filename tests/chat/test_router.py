"""The difficulty router on synthetic data: it learns which prompts need the large model,
and its threshold meets a quality target or a budget of large-model calls."""

from __future__ import annotations

import numpy as np
import pytest

from tierlink.cascade.tune import Target, TargetKind
from tierlink.chat.router import (
    DifficultyRouter,
    fit,
    needs_large,
    routed_quality,
    tune_router,
)
from tierlink.errors import ConfigError


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Feature 0 is the prompt's difficulty: the small model fails hard prompts, the large
    one fails only the hardest; the other features are noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8))
    hard = x[:, 0]
    small_right = hard + 0.3 * rng.normal(size=n) < 0.3
    large_right = hard + 0.3 * rng.normal(size=n) < 1.5
    return x, small_right, large_right


def test_the_router_learns_which_prompts_need_the_large_model() -> None:
    x, small, large = _data(2000, 0)
    router = fit(x, needs_large(small, large))
    assert abs(router.weights[0]) > 5 * np.abs(router.weights[1:]).max()
    xt, st, lt = _data(1000, 1)
    tuned = router.with_threshold(0.5)
    q = routed_quality(tuned, xt, st, lt)
    assert q["accuracy"] > q["small_accuracy"] + 0.1


def test_tuned_for_a_quality_target_and_for_a_budget() -> None:
    x, small, large = _data(2000, 2)
    router = fit(x[:1000], needs_large(small[:1000], large[:1000]))
    target = Target(TargetKind.ACCURACY_FLOOR, float(large[1000:].mean()) - 0.01)
    tuned, tuning = tune_router(router, x[1000:], small[1000:], large[1000:], target)
    q = routed_quality(tuned, x[1000:], small[1000:], large[1000:])
    assert tuning.feasible and q["accuracy"] >= target.value - 1e-9
    assert q["large_share"] < 0.9
    budget, _ = tune_router(router, x[1000:], small[1000:], large[1000:],
                            Target(TargetKind.ESCALATION_BUDGET, 0.2))
    assert routed_quality(budget, x[1000:], small[1000:], large[1000:])["large_share"] <= 0.2


def test_a_router_round_trips_through_json() -> None:
    x, small, large = _data(200, 3)
    router = fit(x, needs_large(small, large)).with_threshold(0.3)
    again = DifficultyRouter.from_dict(router.to_dict())
    assert np.allclose(again.scores(x), router.scores(x)) and again.threshold == 0.3
    with pytest.raises(ConfigError):
        DifficultyRouter.from_dict({"mean": [0.0]})
    with pytest.raises(ConfigError):
        fit(x[:5], np.zeros(5))
