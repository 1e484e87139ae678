"""Requests pinned to a model version (``tierlink.version``) go only where that version is
served -- a canary on standby counts -- and are never answered by another version.

The views are built as a node builds them: from registry records in the heartbeat format
(one entry per served version, ``role`` active / standby), through ``node_views``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tierlink.control.client import fold_versions, node_views
from tierlink.core.types import ClusterView, ModelView, Request
from tierlink.policy import REGISTRY, PolicyConfig, TierlinkPolicy


def entry(version: str, role: str = "active", weight: float = 1.0, *, name: str = "m",
          latency_ms: float = 1.0) -> dict[str, Any]:
    return {"name": name, "task": "t", "version": version, "accuracy": 0.9,
            "latency_ms": latency_ms, "role": role, "weight": weight}


def record(node_id: str, tier: str, models: list[dict[str, Any]], *links: str
           ) -> dict[str, Any]:
    return {"node_id": node_id, "tier": tier, "models": models,
            "links": [{"dst": dst, "rtt_ms": 5.0, "bandwidth_mbit": 100.0} for dst in links]}


def view() -> ClusterView:
    """dev-1 (version 1) -> edge-1 (1, canary 2), edge-2 (1) -> cloud-1 (3)."""
    records = [
        record("dev-1", "device", [entry("1", latency_ms=0.5)], "edge-1", "edge-2"),
        record("edge-1", "edge", [entry("1"), entry("2", "standby", 0.1)], "cloud-1"),
        record("edge-2", "edge", [entry("1")], "cloud-1"),
        record("cloud-1", "cloud", [entry("3")]),
    ]
    nodes, links = node_views(records)
    return ClusterView.build("dev-1", nodes, links)


def req(version: str | None, hops: int = 0) -> Request:
    return Request("r1", "t", 1000.0, origin="dev-1", input_bytes=3136, version=version,
                   hops=hops)


def nodes_of(policy_name: str, request: Request, seed: int,
             config: PolicyConfig | None = None) -> tuple[set[str], str]:
    policy = (TierlinkPolicy(config or PolicyConfig()) if policy_name == "tierlink"
              else REGISTRY.create(policy_name, config))
    plan = policy.plan(request, view(), random.Random(seed))
    return {p.node_id for p in plan.placements}, plan.reason


def test_a_canary_is_folded_into_the_model_it_stands_by_for() -> None:
    (folded,) = fold_versions([entry("1"), entry("2", "standby", 0.1)])
    assert (folded.version, folded.versions) == ("1", ("1", "2"))
    assert folded.holds("2") and folded.holds("1") and not folded.holds("3")
    (plain,) = fold_versions([entry("1")])
    assert plain.versions == () and plain.holds("1")
    assert ModelView("m", "t", "1", 0.9, 1.0).holds("1")
    two = fold_versions([entry("1"), entry("4", name="n")])
    assert [m.name for m in two] == ["m", "n"]


def test_unpinned_requests_may_use_any_node() -> None:
    seen: set[str] = set()
    for seed in range(30):
        seen |= nodes_of("tierlink", req(None), seed)[0]
    assert {"dev-1", "edge-1", "edge-2"} <= seen


def test_a_request_pinned_to_a_canary_goes_only_to_the_node_holding_it() -> None:
    for seed in range(30):
        nodes, _ = nodes_of("tierlink", req("2"), seed)
        assert nodes == {"edge-1"}


def test_a_pinned_request_passes_through_nodes_that_reach_its_version() -> None:
    for seed in range(30):
        nodes, _ = nodes_of("tierlink", req("3"), seed)
        assert nodes and nodes <= {"edge-1", "edge-2"}  # on to cloud-1, the only holder
    # From the edge, only the cloud serves version 3: never the edge's own version 1.
    edge_view = ClusterView.build("edge-1", view().nodes.values(), view().links.values())
    plan = TierlinkPolicy(PolicyConfig()).plan(req("3"), edge_view, random.Random(0))
    assert {p.node_id for p in plan.placements} == {"cloud-1"}


def test_a_pinned_version_out_of_reach_is_refused_naming_it() -> None:
    nodes, reason = nodes_of("tierlink", req("9"), 0)
    assert not nodes and "version '9'" in reason
    # Version 3 is two hops away: with one hop allowed it is out of reach.
    nodes, reason = nodes_of("tierlink", req("3"), 0, PolicyConfig(max_hops=1))
    assert not nodes and "version '3'" in reason


@pytest.mark.parametrize("policy, version, expected", [
    ("cloud_only", "2", {"edge-1"}),
    ("device_only", "1", {"dev-1"}),
    ("device_only", "2", set()),
])
def test_baselines_respect_pins_too(policy: str, version: str, expected: set[str]) -> None:
    for seed in range(10):
        assert nodes_of(policy, req(version), seed)[0] == expected
