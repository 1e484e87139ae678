"""The finite-sample guarantee: exact tests checked against simulation, and the tuned bar
holding on fresh samples at least as often as stated."""

import numpy as np
import pytest

from tierlink.cascade.guarantee import (
    absolute_p_value,
    accuracy_lower_bound,
    bar_grid,
    batch_margin,
    batch_passes,
    relative_bound,
    relative_p_value,
    tune_guaranteed,
)
from tierlink.cascade.tune import Stage, evaluate
from tierlink.core.types import Tier
from tierlink.errors import ConfigError


def population(n, seed=0):
    """Three calibrated stages, the top one best (the cascade's loss depends on the bar)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, tier in enumerate((Tier.DEVICE, Tier.EDGE, Tier.CLOUD)):
        conf = rng.beta(6 + 2 * i, 1, n)
        out.append(Stage(f"m{i}", tier, conf, rng.random(n) < conf, 10.0 ** (i - 3)))
    return out


def sample(stages, idx):
    return [Stage(s.model, s.tier, s.confidence[idx], s.correct[idx], s.cost) for s in stages]


def test_relative_p_value_is_valid_at_the_null_boundary():
    # Simulate n inputs whose true mean loss is exactly the drop: the test may reject at
    # level 0.1 in at most ~10% of samples (it is conservative: the nuisance is bounded).
    rng = np.random.default_rng(1)
    n, drop, p_lose = 2000, 0.004, 0.012
    p_win = p_lose - drop
    rejected = 0
    for _ in range(400):
        draws = rng.multinomial(n, [p_lose, p_win, 1 - p_lose - p_win])
        rejected += relative_p_value(n, int(draws[0]), int(draws[1]), drop) <= 0.1
    assert rejected / 400 <= 0.12


def test_p_values_fall_as_the_room_grows():
    assert relative_p_value(5000, 40, 20, 0.002) > relative_p_value(5000, 40, 20, 0.01)


def test_a_batch_promise_is_harder_than_one_about_the_mean():
    # The batch adds its own noise on top of the calibration's: a smaller batch, more.
    assert batch_margin(5000, 30, 20, 0.005, 1000, 0.05) > \
        batch_margin(5000, 30, 20, 0.005, 10_000, 0.05) > 0
    lost, won = 30, 20  # observed loss 0.2 pt
    assert relative_p_value(5000, lost, won, 0.006) <= 0.1
    assert not batch_passes(5000, lost, won, 0.006, 1000, 0.1)
    assert batch_passes(5000, lost, won, 0.02, 1000, 0.1)


def test_bounds_lie_beyond_the_point_estimate():
    assert relative_bound(5000, 30, 20, 0.9) > (30 - 20) / 5000
    assert accuracy_lower_bound(1000, 930, 0.95) < 0.93
    assert absolute_p_value(1000, 930, accuracy_lower_bound(1000, 930, 0.95)) <= 0.05 + 1e-6


def test_the_bar_grid_is_fixed_and_most_cautious_first():
    grid = bar_grid()
    assert grid[0] == 1.0 and np.all(np.diff(grid) < 0) and grid[-1] > 0


def test_tuned_bar_holds_on_fresh_samples_at_least_as_often_as_stated():
    pop = population(60_000, seed=3)
    rng = np.random.default_rng(4)
    held, device = [], []
    for _ in range(30):
        idx = rng.permutation(60_000)
        cal, fresh = sample(pop, idx[:4000]), sample(pop, idx[4000:12_000])
        got = tune_guaranteed(cal, 0.9, drop=0.005, batch=8000)
        assert got.feasible
        op = evaluate(fresh, got.chosen.thresholds)
        held.append(op.accuracy >= fresh[-1].correct.mean() - 0.005)
        device.append(op.shares[0])
    assert np.mean(held) >= 0.9
    assert np.mean(device) > 0.2  # it does let the device answer, not everything to the top


def test_guarantee_reports_its_bound_and_one_bar_for_every_stage():
    got = tune_guaranteed(population(5000), 0.9, drop=0.01, batch=10_000)
    t = got.chosen.thresholds
    assert len(t) == 2 and t[0] == t[1]
    g = got.guarantee
    assert g.bound is not None and g.bound <= 0.01 and g.samples == 5000
    assert "90% confidence on any 10,000 requests" in g.describe()


def test_absolute_floor_guarantee():
    pop = population(5000)
    got = tune_guaranteed(pop, 0.95, floor=0.85)
    assert got.feasible and got.guarantee.bound >= 0.85
    assert evaluate(pop, got.chosen.thresholds).accuracy >= 0.85


def test_an_unreachable_target_is_infeasible_and_sends_everything_to_the_top():
    got = tune_guaranteed(population(500), 0.99, floor=0.999)
    assert not got.feasible and got.chosen.thresholds == (1.0, 1.0)


@pytest.mark.parametrize("kwargs", [{"drop": 0.01, "floor": 0.9}, {}, {"drop": 1.5},
                                    {"floor": 2.0}])
def test_bad_targets_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        tune_guaranteed(population(100), 0.9, **kwargs)


def test_bad_confidence_is_a_config_error():
    with pytest.raises(ConfigError, match="confidence"):
        tune_guaranteed(population(100), 1.0, drop=0.01)
