"""The learning policy: only feasible options, deterministic for its randomness, taught by
rewards, and quick to follow a change."""

from __future__ import annotations

import random

import pytest

import sim_support as toy
from sim_support import device_view as _view
from sim_support import request as _req
from tierlink.core.types import Privacy
from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet
from tierlink.policy import REGISTRY, BanditPolicy, RewardWeights
from tierlink.policy.bandit import FEATURES, features


def test_it_chooses_only_what_the_constraints_leave_and_keeps_the_rest_as_fallbacks() -> None:
    view, bandit = _view(), REGISTRY.create("bandit", toy.fleet().routing.policy_config())
    tierlink = REGISTRY.create("tierlink", toy.fleet().routing.policy_config())
    assert isinstance(bandit, BanditPolicy)
    for privacy in Privacy:
        for deadline in (8.0, 150.0, 1000.0):
            req = _req(privacy=privacy, deadline=deadline)
            plan, ref = bandit.plan(req, view, random.Random(3)), tierlink.plan(req, view,
                                                                                random.Random(3))
            assert {(p.kind, p.node_id) for p in plan.placements} == {
                (p.kind, p.node_id) for p in ref.placements}
            assert len(plan.features) == len(FEATURES)
            assert plan == bandit.plan(req, view, random.Random(3))  # its randomness only
    local_only = bandit.plan(_req(privacy=Privacy.LOCAL), view, random.Random(1))
    assert {p.node_id for p in local_only.placements} == {"dev-1"}


def test_rewards_teach_it_and_it_follows_a_change() -> None:
    view = _view()
    bandit = BanditPolicy(toy.fleet().routing.policy_config())
    rng = random.Random(5)

    def share(kind_wins: str, rounds: int) -> float:
        chose = []
        for i in range(rounds):
            plan = bandit.plan(_req(i), view, rng)
            first = plan.placements[0]
            won = (first.kind == "local") == (kind_wins == "local")
            bandit.observe(plan, 1.0 if won else -1.0)
            chose.append(won)
        return sum(chose[-100:]) / 100

    assert share("local", 400) > 0.9  # answering on the device pays here
    assert share("remote", 1500) > 0.8  # ... until sending it up pays: it moves over
    assert bandit.model.updates == 1900


def test_reward_weights_come_from_the_fleet_file() -> None:
    raw = {"name": "x", "nodes": [{"id": "d", "tier": "device", "models": ["m"]}],
           "routing": {"bandit": {"reward": {"accuracy": 2, "miss": 3}}}}
    w = parse_fleet(raw).routing.policy_config().reward
    assert w == RewardWeights(accuracy=2.0, miss=3.0)
    assert w.reward(1.0, 50.0, 100.0, 0.0, 1.0) == pytest.approx(2.0 - 0.005)
    assert w.reward(1.0, 150.0, 100.0, 0.0, 1.0) == pytest.approx(2.0 - 0.015 - 3.0)
    raw["routing"] = {"bandit": {"reward": {"speed": 1}}}
    with pytest.raises(ConfigError, match="speed"):
        parse_fleet(raw)


def test_features_describe_the_option() -> None:
    view = _view()
    bandit = BanditPolicy(toy.fleet().routing.policy_config())
    feasible, _ = bandit.feasible_choices(_req(), view, random.Random(0))
    phi = features(_req(), feasible[0], bandit.reference_cost(_req(), view))
    assert phi[FEATURES.index("bias")] == 1.0 and phi[FEATURES.index("privacy:any")] == 1.0
    assert sum(phi[FEATURES.index(f"kind:{k}")] for k in ("local", "cascade", "remote",
                                                          "split")) == 1.0
