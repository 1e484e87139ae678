"""Shadow mode never changes what a node does; off-policy estimates find a candidate's true
value; promotion needs the lower bound to beat the acting policy."""

from __future__ import annotations

import random

import numpy as np
import pytest

import sim_support as toy
from ope_support import synthetic_log as _log
from sim_support import device_view as _view
from sim_support import request as _req
from tierlink.core.types import Privacy
from tierlink.policy import REGISTRY
from tierlink.policy.ope import Estimate, doubly_robust, ips, on_policy, promote
from tierlink.policy.shadow import Shadow


def _policies(**weights: float):
    from dataclasses import replace

    from tierlink.policy.base import Weights

    cfg = toy.fleet().routing.policy_config()
    return (REGISTRY.create("tierlink", cfg),
            REGISTRY.create("tierlink", replace(cfg, weights=Weights(**weights))))


def test_without_exploration_the_node_does_exactly_what_it_did() -> None:
    view = _view()
    acting, candidate = _policies(cost=0.0, latency=0.0)
    for i in range(60):
        req = _req(i, privacy=list(Privacy)[i % 3], deadline=(8.0, 150.0, 1000.0)[i % 3])
        alone, shadowed = random.Random(i), random.Random(i)
        plan = acting.plan(req, view, alone)
        shadow_plan, decision = Shadow(acting, candidate, 0.0, random.Random(99)).plan(
            req, view, shadowed)
        assert shadow_plan == plan
        assert alone.random() == shadowed.random()  # the node's randomness untouched
        assert decision is not None and decision.propensity == 1.0


def test_exploration_puts_a_random_option_first_with_its_propensity() -> None:
    view = _view()
    acting, candidate = _policies()
    shadow = Shadow(acting, candidate, 0.3, random.Random(1))
    own = acting.plan(_req(), view, random.Random(0)).placements[0]
    firsts, props = [], set()
    for i in range(2000):
        plan, decision = shadow.plan(_req(i), view, random.Random(0))
        assert decision is not None
        firsts.append(plan.placements[0] == own)
        k = len(decision.arms)
        expected = 0.7 + 0.3 / k if plan.placements[0] == own else 0.3 / k
        props.add(round(decision.propensity, 6))
        assert decision.propensity == pytest.approx(expected)
    assert np.mean(firsts) == pytest.approx(0.7 + 0.3 / k, abs=0.04)
    assert len(props) == 2


def test_ips_and_doubly_robust_find_the_candidates_value() -> None:
    log, true = _log(20_000, 0.2, 3)
    for est in (ips(log), doubly_robust(log)):
        assert est.ci_low <= true <= est.ci_high
    assert doubly_robust(log).ci_high - doubly_robust(log).ci_low < ips(log).ci_high - ips(
        log).ci_low


def test_promotion_needs_the_lower_bound_to_beat_the_acting_policy() -> None:
    log, _ = _log(20_000, 0.2, 4)
    acting = on_policy(log)
    assert promote(doubly_robust(log), acting)  # the candidate is clearly better here
    assert not promote(Estimate(acting.value + 0.01, acting.value - 0.01, 1.0, 100), acting)
    assert not promote(Estimate(float("nan"), float("nan"), float("nan"), 0), acting)
