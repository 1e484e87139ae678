"""A node's upstreams follow the registry: by tier and labels, drained nodes left out."""

from __future__ import annotations

from tierlink.node.spec import UpstreamSpec
from tierlink.node.topology import Topology, UpstreamRule, choose_upstreams

EDGE_RULE = UpstreamRule("edge", ("site",))


def rec(node_id: str, tier: str = "edge", draining: bool = False, **labels: str) -> dict:
    return {"node_id": node_id, "tier": tier, "address": f"http://10.0.0.1/{node_id}",
            "labels": labels, "draining": draining}


def test_the_rule_picks_alive_nodes_of_the_tier_in_my_site():
    records = [rec("edge-1", site="a"), rec("edge-2", site="b"), rec("cloud-1", "cloud"),
               rec("dev-1", "device", site="a")]
    chosen = choose_upstreams("dev-1", {"site": "a"}, EDGE_RULE, records, {})
    assert chosen == {"edge-1": UpstreamSpec("edge-1", "http://10.0.0.1/edge-1")}


def test_a_node_without_the_label_takes_every_node_of_the_tier():
    records = [rec("edge-1", site="a"), rec("edge-2")]
    assert set(choose_upstreams("dev-1", {}, EDGE_RULE, records, {})) == {"edge-1", "edge-2"}


def test_a_declared_link_is_how_a_chosen_node_is_reached():
    via = UpstreamSpec("edge-1", "http://127.0.0.1:9001", rtt_ms=10.0)
    chosen = choose_upstreams("dev-1", {}, EDGE_RULE, [rec("edge-1")], {"edge-1": via})
    assert chosen["edge-1"] is via
    # ... but it does not make a node an upstream the registry does not list.
    assert choose_upstreams("dev-1", {}, EDGE_RULE, [rec("edge-2")], {"edge-1": via}) == {
        "edge-2": UpstreamSpec("edge-2", "http://10.0.0.1/edge-2")}


def test_drained_nodes_are_left_out_static_or_not():
    records = [rec("edge-1", draining=True), rec("edge-2")]
    assert set(choose_upstreams("dev-1", {}, EDGE_RULE, records, {})) == {"edge-2"}
    declared = {n: UpstreamSpec(n, f"http://x/{n}") for n in ("edge-1", "edge-2")}
    assert set(choose_upstreams("dev-1", {}, None, records, declared)) == {"edge-2"}


def test_topology_changes_the_shared_dict_in_place():
    made: list[str] = []

    def make(u: UpstreamSpec) -> str:
        made.append(u.node_id)
        return f"upstream:{u.node_id}"

    topo = Topology("dev-1", {"site": "a"}, EDGE_RULE, (), make)
    shared = topo.upstreams
    assert topo.sync([]) is False and shared == {}  # no view yet: nothing to go on
    first = [rec("edge-1", site="a")]
    assert topo.sync(first) is True and shared == {"edge-1": "upstream:edge-1"}
    assert topo.sync(first) is False  # the same list is looked at once
    assert topo.sync([rec("edge-1", site="a"), rec("edge-9", site="a")]) is True
    assert set(shared) == {"edge-1", "edge-9"} and made == ["edge-1", "edge-9"]
    assert topo.sync([rec("edge-9", site="a"), rec("edge-1", site="a", draining=True)])
    assert shared == {"edge-9": "upstream:edge-9"} and topo.upstreams is shared


def test_a_static_topology_starts_with_the_declared_upstreams():
    declared = (UpstreamSpec("edge-1", "http://x/1"),)
    topo = Topology("dev-1", {}, None, declared, lambda u: u.url)
    assert topo.upstreams == {"edge-1": "http://x/1"}
    assert topo.sync([rec("edge-2")]) is False  # static: the registry adds nobody
    assert topo.sync([rec("edge-1", draining=True)]) is True and topo.upstreams == {}
