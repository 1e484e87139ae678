import itertools

import numpy as np
import pytest

from tierlink.cascade.tune import (
    Stage,
    Target,
    TargetKind,
    answering_stage,
    candidates,
    evaluate,
    evaluate_assignment,
    single,
    tune,
)
from tierlink.core.types import Tier
from tierlink.errors import ConfigError


def stages(n=3000, seed=0, costs=(0.0, 0.01, 1.0)):
    """Three synthetic stages whose confidence predicts correctness, better upstream."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (tier, cost) in enumerate(zip((Tier.DEVICE, Tier.EDGE, Tier.CLOUD), costs)):
        conf = rng.beta(5 + 2 * i, 1, n)
        correct = rng.random(n) < conf  # calibrated by construction
        out.append(Stage(f"m{i}", tier, conf, correct, cost))
    return out


def brute_force_cheapest(st, floor, count):
    best = None
    for ts in itertools.product(candidates(st[0].confidence, count),
                                candidates(st[1].confidence, count)):
        op = evaluate(st, ts)
        if op.accuracy >= floor and (best is None or op.cost < best.cost):
            best = op
    return best


def test_answering_stage_follows_thresholds():
    st = stages(6)
    st[0] = Stage("a", Tier.DEVICE, np.array([.9, .5, .5, .99, .1, .7]), np.ones(6, bool), 0)
    st[1] = Stage("b", Tier.EDGE, np.array([.1, .8, .2, .1, .95, .1]), np.ones(6, bool), 0)
    assert answering_stage(st, (0.7, 0.8)).tolist() == [0, 1, 2, 0, 1, 0]


def test_evaluate_counts_accuracy_cost_and_shares():
    st = stages(1000)
    op = evaluate(st, (0.0, 0.0))  # the first stage answers everything
    assert op.shares == (1.0, 0.0, 0.0) and op.escalated == 0.0
    assert op.accuracy == pytest.approx(st[0].correct.mean()) and op.cost == 0.0
    op = evaluate(st, (1.0, 1.0))
    # Nothing is certain: everything reaches the cloud and pays every stage on the way.
    assert op.shares[2] == pytest.approx(1.0) and op.cost == pytest.approx(1.01)
    assert single(st, 2).cost == 1.0


@pytest.mark.parametrize("floor", [0.86, 0.88, 0.9])
def test_accuracy_floor_is_met_at_least_cost_like_brute_force(floor):
    st = stages()
    tuned = tune(st, Target(TargetKind.ACCURACY_FLOOR, floor, prefer="cost"), count=21)
    assert tuned.feasible and tuned.chosen.accuracy >= floor
    reference = brute_force_cheapest(st, floor, 21)
    assert tuned.chosen.cost == pytest.approx(reference.cost, abs=1e-12)


def test_escalation_budget_and_cost_ceiling_hold():
    st = stages()
    esc = tune(st, Target(TargetKind.ESCALATION_BUDGET, 0.2))
    assert esc.feasible and esc.chosen.escalated <= 0.2
    looser = tune(st, Target(TargetKind.ESCALATION_BUDGET, 0.5))
    assert looser.chosen.accuracy >= esc.chosen.accuracy
    ceiling = 0.1 * single(st, 2).cost
    cost = tune(st, Target(TargetKind.COST_CEILING, ceiling))
    assert cost.feasible and cost.chosen.cost <= ceiling
    assert cost.chosen.accuracy > single(st, 0).accuracy  # escalation buys accuracy


def test_an_impossible_target_says_so_and_gives_the_closest_setting():
    st = stages()
    tuned = tune(st, Target(TargetKind.ACCURACY_FLOOR, 0.999))
    assert not tuned.feasible
    best_alone = max(single(st, i).accuracy for i in range(3))
    assert tuned.chosen.accuracy >= best_alone - 0.01


def test_calibrated_confidence_beats_random_escalation_at_the_same_rate():
    st = stages(seed=3)
    op = evaluate(st[::2], (0.9,))  # device -> cloud
    rng = np.random.default_rng(0)
    n = len(st[0].correct)
    at = np.zeros(n, dtype=int)
    at[rng.choice(n, round(op.escalated * n), replace=False)] = 1
    rand = evaluate_assignment(st[::2], at)
    assert rand.escalated == pytest.approx(op.escalated)
    assert op.accuracy > rand.accuracy + 0.01


def test_bad_stages_and_thresholds_are_config_errors():
    st = stages(10)
    with pytest.raises(ConfigError, match="two stages"):
        tune(st[:1], Target(TargetKind.ACCURACY_FLOOR, 0.5))
    with pytest.raises(ConfigError, match="takes 2 threshold"):
        evaluate(st, (0.5,))
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        evaluate(st, (0.5, 1.5))
    short = Stage("x", Tier.EDGE, np.ones(3), np.ones(3, bool), 0.0)
    with pytest.raises(ConfigError, match="must both be"):
        evaluate([st[0], short], (0.5,))


def test_preferring_the_device_escalates_least_and_then_spends_least():
    st = stages(seed=1)
    device = tune(st, Target(TargetKind.ACCURACY_FLOOR, 0.88), count=41)
    cheap = tune(st, Target(TargetKind.ACCURACY_FLOOR, 0.88, prefer="cost"), count=41)
    assert device.feasible and cheap.feasible
    assert device.chosen.escalated <= cheap.chosen.escalated
    assert cheap.chosen.cost <= device.chosen.cost
    # No setting meeting the floor keeps more on the device.
    for t0 in candidates(st[0].confidence, 41):
        for t1 in candidates(st[1].confidence, 41):
            op = evaluate(st, (t0, t1))
            if op.accuracy >= 0.88:
                assert op.escalated >= device.chosen.escalated - 1e-12
    with pytest.raises(ConfigError, match="prefer"):
        Target(TargetKind.ACCURACY_FLOOR, 0.9, prefer="speed")
