"""Mirroring's pure half: which answers are mirrored, and where a mirrored request goes —
to the most capable model its privacy allows, never further."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

import sim_support as toy
from tierlink.core.types import Privacy, Request, Tier
from tierlink.errors import PrivacyViolation
from tierlink.routing.desk import PolicyDesk
from tierlink.routing.mirror import MostCapable, mirror_odds
from tierlink.routing.router import Router
from tierlink.settings.routing import parse_routing


def mirrored(privacy: Privacy, hops: int = 0, origin: str = "dev-1") -> Request:
    return Request("r.mirror", "toy", 10_000.0, origin, privacy, input_bytes=3136, hops=hops,
                   mirror=True)


def at(node: str):
    return replace(toy.device_view(), self_id=node)


def router(node: str, tier: Tier) -> Router:
    return Router(PolicyDesk(node, tier, parse_routing({})), random.Random(0))


def test_a_mirrored_request_walks_up_to_the_most_capable_model_its_privacy_allows():
    policy = MostCapable(max_hops=3)
    rng = random.Random(0)
    # any: from the device through an edge to the cloud's large model
    first = policy.plan(mirrored(Privacy.ANY), at("dev-1"), rng)
    # both edges reach the cloud: the second is the dispatcher's fallback
    assert [(p.kind, p.node_id) for p in first.placements] == [("remote", "edge-1"),
                                                               ("remote", "edge-2")]
    assert first.placements[0].est_accuracy == pytest.approx(0.95)
    second = policy.plan(mirrored(Privacy.ANY, hops=1), at("edge-1"), rng)
    assert [(p.kind, p.node_id) for p in second.placements] == [("remote", "cloud-1")]
    third = policy.plan(mirrored(Privacy.ANY, hops=2), at("cloud-1"), rng)
    assert [(p.kind, p.model) for p in third.placements] == [("local", "toy-large")]
    # site: no further than an edge, whose medium model is then the most capable
    site = policy.plan(mirrored(Privacy.SITE), at("dev-1"), rng)
    assert {p.tier for p in site.placements} == {Tier.EDGE}
    assert site.placements[0].est_accuracy == pytest.approx(0.88)
    at_edge = policy.plan(mirrored(Privacy.SITE, hops=1), at("edge-1"), rng)
    assert [(p.kind, p.model) for p in at_edge.placements] == [("local", "toy-medium")]
    # local: the device's own model is all there is
    local = policy.plan(mirrored(Privacy.LOCAL), at("dev-1"), rng)
    assert [(p.kind, p.model) for p in local.placements] == [("local", "toy-small")]
    # out of hops: what is here
    tired = policy.plan(mirrored(Privacy.ANY, hops=3), at("dev-1"), rng)
    assert [p.kind for p in tired.placements] == ["local"]


@pytest.mark.parametrize("privacy", list(Privacy))
@pytest.mark.parametrize(("node", "tier", "hops"), [("dev-1", Tier.DEVICE, 0),
                                                    ("edge-1", Tier.EDGE, 1),
                                                    ("cloud-1", Tier.CLOUD, 2)])
def test_mirroring_never_crosses_a_privacy_boundary(privacy: Privacy, node: str, tier: Tier,
                                                    hops: int) -> None:
    """Every mirrored plan passes the router's own privacy check, at every hop, and every
    node it names may hold the input."""
    if not privacy.allows(tier, at_origin=node == "dev-1"):
        return  # such a request never reaches this node (the desk refuses it on receipt)
    route = router(node, tier)
    policy, req = route.arrive(mirrored(privacy, hops))
    assert policy is route.desk.most_capable
    plan = route.plan(policy, req, at(node))[0]
    assert plan.placements
    for p in plan.placements:
        assert privacy.allows(p.tier, at_origin=p.node_id == "dev-1")


def test_the_router_refuses_a_mirrored_plan_that_would_cross_privacy():
    bad = replace(MostCapable(3).plan(mirrored(Privacy.ANY), at("dev-1"), random.Random(0)),
                  policy="most_capable")
    with pytest.raises(PrivacyViolation):
        router("dev-1", Tier.DEVICE).admit(mirrored(Privacy.LOCAL), bad)


def test_mirror_odds_keep_the_share_and_balance_a_canary_against_its_baseline():
    assert mirror_odds(0.0, 0.2, True) == 0.0
    assert mirror_odds(0.05, 0.0, False) == 0.05
    # a canary at 10%: half the mirrors each side, 5% of all answers in total
    canary, active = mirror_odds(0.05, 0.1, True), mirror_odds(0.05, 0.1, False)
    assert canary == pytest.approx(0.25) and active == pytest.approx(0.05 / 1.8)
    assert 0.1 * canary + 0.9 * active == pytest.approx(0.05)
    assert mirror_odds(0.05, 0.01, True) == 1.0  # capped: never more than every answer
