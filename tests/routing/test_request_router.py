"""The routing core: one Router for the live node and the simulated one — arrival (the
desk's receipt and policy choice), the plan with a shadow candidate beside it, and the
feedback after the answer."""

from __future__ import annotations

import random

import pytest

import sim_support as toy
from tierlink.core.types import ClusterView, Placement, Plan, Privacy, Request, Tier
from tierlink.errors import DeadlineExceeded, InvalidRequest, PrivacyViolation
from tierlink.policy import BanditPolicy, PolicyConfig
from tierlink.policy.ope import Logged
from tierlink.routing.desk import PolicyDesk
from tierlink.routing.router import Router, shadow_run
from tierlink.settings.routing import parse_routing


def desk(**routing: object) -> tuple[PolicyDesk, list[tuple[str, str]]]:
    counted: list[tuple[str, str]] = []
    made = PolicyDesk("dev-1", Tier.DEVICE, parse_routing(routing),
                      lambda privacy, verdict: counted.append((privacy, verdict)))
    return made, counted


def test_a_node_makes_the_fleets_policy_with_its_options_and_others_on_first_use():
    made, _ = desk(policy={"name": "bandit", "options": {"prior_weight": 3}},
                   allow_policy_override=True)
    assert isinstance(made.default, BanditPolicy)
    assert made.for_request(Request("r", "toy", 100.0, "dev-1")) is made.default
    other = made.for_request(Request("r", "toy", 100.0, "dev-1", policy="cloud_only"))
    assert other.name == "cloud_only" and made.named("cloud_only") is other
    with pytest.raises(InvalidRequest, match="unknown policy 'nope'"):
        made.named("nope")


def test_arrival_refuses_what_the_node_may_not_hold_and_counts_it():
    counted: list[tuple[str, str]] = []
    router = Router(PolicyDesk("edge-1", Tier.EDGE, parse_routing({}),
                               lambda p, v: counted.append((p, v))), random.Random(0))
    with pytest.raises(PrivacyViolation, match="may not hold a 'local' input"):
        router.arrive(Request("r", "toy", 100.0, "dev-1", Privacy.LOCAL))
    with pytest.raises(DeadlineExceeded):
        router.arrive(Request("r", "toy", 0.0, "dev-1", hops=1))
    with pytest.raises(InvalidRequest, match="does not allow choosing the policy"):
        router.arrive(Request("r", "toy", 100.0, "dev-1", policy="cloud_only"))
    policy, req = router.arrive(Request("r", "toy", 100.0, "dev-1"))
    assert policy is router.desk.default and req.deadline_ms == 100.0
    assert counted == [("local", "violation"), ("any", "allowed"), ("any", "allowed")]


def test_in_shadow_mode_the_candidate_decides_beside_and_the_outcome_is_logged():
    view = toy.device_view()
    logged: list[Logged] = []
    router = Router(desk()[0], random.Random(1))
    router.shadow = shadow_run("bandit", PolicyConfig(), None, 0.0, random.Random(2),
                               logged.append, PolicyConfig().reward)
    policy, req = router.arrive(Request("r", "toy", 500.0, "dev-1", input_bytes=3136))
    plan, decision = router.plan(policy, req, view)
    assert decision is not None and decision.propensity == 1.0  # no exploration
    assert plan == policy.plan(req, view, random.Random(1))  # the acting policy's plan
    router.feedback(policy, plan, decision, req, view, None, 0.0, 600.0)
    assert len(logged) == 1 and logged[0].acting == decision.acting
    forwarded = Request("r", "toy", 500.0, "edge-1", hops=1, input_bytes=3136)
    assert router.plan(policy, forwarded, view)[1] is None  # only an application's own


def test_a_learning_policy_hears_its_plans_through_the_router():
    made, _ = desk(policy="bandit")
    router, view = Router(made, random.Random(0)), toy.device_view()
    policy, req = router.arrive(Request("r", "toy", 500.0, "dev-1", input_bytes=3136))
    plan, decision = router.plan(policy, req, view)
    before = made.default.model.updates  # type: ignore[attr-defined]
    router.feedback(policy, plan, decision, req, view, None, 1.0, 20.0)
    assert made.default.model.updates == before + 1  # type: ignore[attr-defined]


def test_any_policy_runs_in_shadow_mode_beside_any_acting_policy():
    """A candidate that is not a tierlink policy is matched to the feasible option its plan
    starts with; one whose plan starts outside them (cloud_only with a local input) is
    logged as such, with zero features; an acting baseline is shadowed over a tierlink
    frame's options and acts exactly as it does alone."""
    view, config = toy.device_view(), PolicyConfig()
    logged: list[Logged] = []

    def shadowing(candidate: str) -> Router:
        router = Router(desk(allow_policy_override=True)[0], random.Random(1))
        router.shadow = shadow_run(candidate, config, None, 0.0, random.Random(2),
                                   logged.append, config.reward)
        return router

    local = Request("r", "toy", 500.0, "dev-1", Privacy.LOCAL, input_bytes=3136)
    router = shadowing("device_only")
    policy, req = router.arrive(local)
    _, decision = router.plan(policy, req, view)
    assert decision is not None and decision.candidate == "local:dev-1:toy-small"
    assert decision.candidate in decision.arms

    router = shadowing("cloud_only")
    _, decision = router.plan(policy, req, view)
    assert decision is not None and decision.candidate.startswith("outside:remote:")
    assert set(decision.candidate_features) == {0.0}

    router = shadowing("tierlink")
    baseline, req = router.arrive(Request("r", "toy", 500.0, "dev-1", input_bytes=3136,
                                          policy="device_only"))
    plan, decision = router.plan(baseline, req, view)
    assert plan == baseline.plan(req, view, random.Random(1))  # it acts as it does alone
    assert decision is not None and decision.acting == "local:dev-1:toy-small"
    assert decision.propensity == 1.0
    router.feedback(baseline, plan, decision, req, view, None, 0.0, 600.0)
    assert logged[-1].acting == decision.acting and logged[-1].candidate == decision.candidate
    # exploring always: an option the baseline would not take goes first, under its name
    router.shadow = shadow_run("tierlink", config, None, 1.0, random.Random(3), logged.append,
                               config.reward)
    explored, decision = router.plan(baseline, req, view)
    assert explored.policy == "device_only" and decision is not None
    assert decision.propensity == pytest.approx(1.0 / len(decision.arms))

def test_the_live_node_and_the_simulator_route_through_the_same_router():
    import asyncio

    from tierlink.sim import loop
    from tierlink.sim.build import build

    async def main() -> Router:
        fleet, _ = build(toy.fleet(), toy.views(), {"toy": toy.outcomes()},
                         asyncio.get_running_loop().time, seed=1)
        return fleet.nodes["dev-1"].router

    assert type(loop.run(main)) is Router
    from tierlink.node import service

    assert service.Router is Router  # NodeService builds one too (tests/node: its routes)


class Leaky:
    """A deliberately bad policy: every request to ``target``, whatever its privacy (as a
    split's features when ``cut`` is set)."""

    name = "leaky"
    respects_deadline = True

    def __init__(self, target: Placement) -> None:
        self.target = target

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan:
        here = Placement("local", "dev-1", Tier.DEVICE, "toy-small")
        return Plan((self.target, here), self.name, "anywhere")


CLOUD = Placement("remote", "cloud-1", Tier.CLOUD)
EDGE = Placement("remote", "edge-1", Tier.EDGE)
EDGE_SPLIT = EDGE._replace(model="toy-small", cut="h", codec="fp16")


@pytest.mark.parametrize(("target", "privacy", "refused"), [
    (CLOUD, Privacy.LOCAL, True), (CLOUD, Privacy.SITE, True), (CLOUD, Privacy.ANY, False),
    (EDGE, Privacy.LOCAL, True), (EDGE, Privacy.SITE, False),
    (EDGE_SPLIT, Privacy.LOCAL, True), (EDGE_SPLIT, Privacy.SITE, False),
])
def test_a_plan_that_moves_an_input_beyond_its_privacy_is_refused_whatever_the_policy(
        target: Placement, privacy: Privacy, refused: bool) -> None:
    refusals: list[tuple[str, str]] = []
    router = Router(desk()[0], random.Random(0), refused=lambda *r: refusals.append(r))
    req = Request("r", "toy", 500.0, "dev-1", privacy)
    if not refused:
        assert router.plan(Leaky(target), req, toy.device_view())[0].placements[0] == target
        assert refusals == []
        return
    with pytest.raises(PrivacyViolation, match=f"policy 'leaky' planned to send a "
                                               f"'{privacy.value}' request's") as info:
        router.plan(Leaky(target), req, toy.device_view())
    assert refusals == [(privacy.value, "leaky")]
    assert info.value.http_status == 403 and info.value.details["policy"] == "leaky"


def test_a_local_inputs_features_leave_only_where_the_fleet_allows_it() -> None:
    req = Request("r", "toy", 500.0, "dev-1", Privacy.LOCAL)
    closed = Router(desk()[0], random.Random(0))
    with pytest.raises(PrivacyViolation) as info:
        closed.admit(req, Leaky(EDGE_SPLIT).plan(req, toy.device_view(), random.Random(0)))
    assert "local_features_may_leave" in (info.value.hint or "")
    opened = Router(desk(local_features_may_leave=True)[0], random.Random(0))
    plan = Leaky(EDGE_SPLIT).plan(req, toy.device_view(), random.Random(0))
    assert opened.admit(req, plan) is plan
    with pytest.raises(PrivacyViolation):  # the raw input still may not leave
        opened.admit(req, Leaky(EDGE).plan(req, toy.device_view(), random.Random(0)))
