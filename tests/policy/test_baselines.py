"""The plain power-of-two balancer: the same feasible set as ``tierlink``, ordered only by
which of two random options answers sooner."""

from __future__ import annotations

import random

import sim_support as toy
from tierlink.core.types import Privacy
from tierlink.policy import REGISTRY, PowerOfTwoPolicy, TierlinkPolicy


def test_it_plans_within_tierlinks_feasible_set_by_expected_latency_alone() -> None:
    view = toy.device_view()
    config = toy.fleet().routing.policy_config()
    p2c, tierlink = REGISTRY.create("power_of_two", config), TierlinkPolicy(config)
    assert isinstance(p2c, PowerOfTwoPolicy)
    for i in range(50):
        req = toy.request(i, Privacy.ANY, 1000.0)
        feasible, _ = tierlink.feasible_choices(req, view, random.Random(i))
        plan = p2c.plan(req, view, random.Random(i))
        first = plan.placements[0]
        assert any(c.node.node_id == first.node_id or (c.pick and c.pick.node_id ==
                                                        first.node_id) for c in feasible)
        assert plan.policy == "power_of_two"
    # the pair is drawn: over many draws, more than one option leads
    plans = {p2c.plan(toy.request(i), view, random.Random(i)).placements for i in range(200)}
    assert len(plans) >= 2


def test_the_sooner_of_the_pair_goes_first() -> None:
    view = toy.device_view()
    policy = PowerOfTwoPolicy(toy.fleet().routing.policy_config())
    req = toy.request(0, Privacy.ANY, 1000.0)
    feasible, _ = policy.feasible_choices(req, view, random.Random(0))
    order = policy.order(req, view, feasible, random.Random(3))
    assert order[0].est.latency_ms <= order[1].est.latency_ms
    assert sorted(map(id, order)) == sorted(map(id, feasible))
