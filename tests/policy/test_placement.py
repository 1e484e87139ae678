import random

import pytest

from tierlink.core.types import Privacy, Request, Tier
from tierlink.errors import ConfigError
from tierlink.policy import (
    REGISTRY,
    CloudOnlyPolicy,
    PolicyConfig,
    PolicyRegistry,
    TierlinkPolicy,
)
from tierlink.policy.placement import hard_slice_accuracy
from tierlink.testing.views import fleet_view


def req(privacy: Privacy = Privacy.ANY, deadline: float = 1000.0, **kw) -> Request:
    return Request("r1", "fmnist", deadline, origin="dev-1", privacy=privacy,
                   input_bytes=3136, **kw)


def plan(view, request, seed=0):
    return TierlinkPolicy(PolicyConfig()).plan(request, view, random.Random(seed))


@pytest.mark.parametrize("deadline", [5.0, 30.0, 150.0, 1000.0])
def test_local_request_never_leaves_its_device(deadline):
    for seed in range(20):
        p = plan(fleet_view(), req(Privacy.LOCAL, deadline), seed)
        assert not p.empty
        assert {pl.node_id for pl in p.placements} == {"dev-1"}
        assert all(pl.kind == "local" for pl in p.placements)


def test_local_request_arriving_off_its_origin_is_refused():
    view = fleet_view(self_id="edge-1")
    p = plan(view, req(Privacy.LOCAL))
    assert p.empty and "privacy 'local'" in p.reason


@pytest.mark.parametrize("self_id", ["dev-1", "edge-1"])
def test_site_request_never_reaches_the_cloud(self_id):
    for seed in range(20):
        p = plan(fleet_view(self_id=self_id), req(Privacy.SITE, 5000.0), seed)
        assert p.placements and all(pl.tier <= Tier.EDGE for pl in p.placements)


def test_any_request_may_reach_the_cloud_from_the_edge():
    p = plan(fleet_view(self_id="edge-1"), req(Privacy.ANY, 5000.0))
    assert any(pl.tier == Tier.CLOUD for pl in p.placements)


def test_infeasible_upstream_is_excluded():
    # 30 ms cannot afford the edge->cloud RTT of 80 ms: the edge keeps the request.
    p = plan(fleet_view(self_id="edge-1"), req(Privacy.ANY, 30.0))
    assert p.placements and all(pl.tier != Tier.CLOUD for pl in p.placements)


def test_no_feasible_placement_says_why():
    p = plan(fleet_view(), req(Privacy.ANY, 0.1))
    assert p.empty and "deadline 0.1 ms cannot be met" in p.reason


def test_power_of_two_picks_the_shorter_queue():
    view = fleet_view(edge_queues={"edge-1": 40, "edge-2": 0})
    for seed in range(10):
        remote = [pl for pl in plan(view, req(), seed).placements if pl.kind == "remote"]
        assert remote[0].node_id == "edge-2"
        assert remote[1].node_id == "edge-1"  # the other choice is the fallback


def test_power_of_two_samples_among_many():
    view = fleet_view(edges=100, edge_queues={f"edge-{i}": i for i in range(1, 101)})
    picks = {next(pl for pl in plan(view, req(), s).placements if pl.kind == "remote").node_id
             for s in range(30)}
    assert len(picks) > 5  # sampled, not always the same global minimum


def test_open_breaker_node_is_skipped():
    view = fleet_view(unhealthy=frozenset({"edge-1"}))
    p = plan(view, req())
    assert "edge-1" not in {pl.node_id for pl in p.placements}


def test_cascade_escalates_from_the_device_with_its_threshold():
    p = plan(fleet_view(), req(Privacy.ANY, 150.0))
    first = p.placements[0]
    assert first.kind == "local" and first.node_id == "dev-1"
    assert first.escalate_below == pytest.approx(0.9)
    assert p.placements[1].kind == "remote" and p.placements[1].tier == Tier.EDGE
    assert p.reason.startswith("cascade")


def test_fallback_placements_answer_finally():
    p = plan(fleet_view(), req(Privacy.ANY, 150.0))
    assert all(pl.escalate_below is None for pl in p.placements[1:])


def test_version_pin_excludes_nodes_without_it():
    p = plan(fleet_view(), req(Privacy.ANY, 150.0, version="7"))
    assert p.empty and "version '7'" in p.reason


def test_threshold_comes_from_config():
    # A tolerance that calls the cascade accurate enough: it is then the cheapest option.
    cfg = PolicyConfig(thresholds={"fmnist-small": 0.8}, accuracy_tolerance=1.5)
    p = TierlinkPolicy(cfg).plan(req(), fleet_view(), random.Random(0))
    assert p.placements[0].escalate_below == pytest.approx(0.8)


def test_hard_slice_accuracy_is_below_overall():
    assert hard_slice_accuracy(0.93, 0.15) < 0.93
    assert hard_slice_accuracy(0.93, 0.0) == 0.93


def test_registry_refuses_duplicates_and_unknown_names():
    reg = PolicyRegistry()
    reg.register("x", TierlinkPolicy)
    reg.register("x", TierlinkPolicy)  # the same factory again: one entry
    with pytest.raises(ConfigError, match="policy 'x' is already registered"):
        reg.register("x", CloudOnlyPolicy)
    with pytest.raises(ConfigError, match="policy 'tierlink' is already registered"):
        reg.register("tierlink", CloudOnlyPolicy)  # a built-in's name (its entry point)
    with pytest.raises(ConfigError, match="unknown policy"):
        REGISTRY.create("nope")


def test_cloud_only_baseline_forwards_up_and_ignores_privacy():
    """Its plans are the router's to refuse (tests/routing/test_request_router.py)."""
    pol = REGISTRY.create("cloud_only")
    p = pol.plan(req(Privacy.LOCAL), fleet_view(), random.Random(0))
    assert p.placements[0].kind == "remote"
    top = pol.plan(req(), fleet_view(self_id="cloud-1"), random.Random(0))
    assert top.placements[0].kind == "local"


def test_device_only_baseline_stays_local():
    p = REGISTRY.create("device_only").plan(req(), fleet_view(), random.Random(0))
    assert [pl.kind for pl in p.placements] == ["local"]


@pytest.mark.parametrize(("privacy", "at", "kind", "tier"), [
    (Privacy.LOCAL, "dev-1", "local", Tier.DEVICE),
    (Privacy.SITE, "dev-1", "remote", Tier.EDGE),
    (Privacy.SITE, "edge-1", "local", Tier.EDGE),
    (Privacy.ANY, "dev-1", "remote", Tier.EDGE),   # the cloud is reached through an edge
    (Privacy.ANY, "edge-1", "remote", Tier.CLOUD),
    (Privacy.ANY, "cloud-1", "local", Tier.CLOUD),
])
def test_static_rules_sends_each_request_to_the_most_capable_tier_its_privacy_allows(
        privacy, at, kind, tier):
    pol = REGISTRY.create("static_rules")
    for deadline in (5.0, 1000.0):  # whatever the deadline
        p = pol.plan(req(privacy, deadline), fleet_view(self_id=at), random.Random(0))
        assert (p.placements[0].kind, p.placements[0].tier) == (kind, tier)
        assert all(pl.tier == tier for pl in p.placements)
        assert not p.respects_deadline


def test_static_rules_answers_locally_when_no_allowed_tier_above_is_healthy():
    view = fleet_view(self_id="edge-1", unhealthy=frozenset({"cloud-1"}))
    p = REGISTRY.create("static_rules").plan(req(Privacy.ANY), view, random.Random(0))
    assert [(pl.kind, pl.node_id) for pl in p.placements] == [("local", "edge-1")]


def test_reserve_keeps_time_for_the_way_back():
    # Edge option needs ~13 ms; with 15 ms of deadline and a 5 ms reserve it does not fit.
    tight = TierlinkPolicy(PolicyConfig(reserve_ms=5.0)).plan(req(Privacy.ANY, 15.0),
                                                            fleet_view(), random.Random(0))
    assert next(p.kind for p in tight.placements) == "local"
    assert all(p.escalate_below is None for p in tight.placements)
    loose = TierlinkPolicy(PolicyConfig(reserve_ms=0.0)).plan(req(Privacy.ANY, 15.0),
                                                            fleet_view(), random.Random(0))
    assert loose.reason.startswith("cascade")
