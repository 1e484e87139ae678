"""The fabric's plan and commands (pure), and undoing a half-made fabric."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest

from tierlink.errors import ConfigError
from tierlink.netns.fabric import (
    Fabric,
    FabricPlan,
    NetnsError,
    down_commands,
    in_netns,
    pick_subnet,
    plan_fabric,
    up_commands,
)
from tierlink.netns.shaping import link_commands, qdisc_commands

NET = ipaddress.IPv4Network("10.201.7.0/24")


def test_a_plan_gives_each_node_a_namespace_and_an_address() -> None:
    plan = plan_fabric("abc123", ["cloud-1", "edge-1", "dev-1"], NET)
    assert plan.gateway == "10.201.7.1" and plan.bridge == "tlbabc123"
    assert [(h.netns, h.veth, h.address) for h in plan.hosts] == [
        ("tl-abc123-0", "tlvabc1230", "10.201.7.10"),
        ("tl-abc123-1", "tlvabc1231", "10.201.7.11"),
        ("tl-abc123-2", "tlvabc1232", "10.201.7.12")]
    assert all(len(h.veth) <= 15 for h in plan.hosts)
    assert FabricPlan.from_dict(plan.to_dict()) == plan
    assert in_netns(plan.host("dev-1"), ["python"]) == ["ip", "netns", "exec", "tl-abc123-2",
                                                         "python"]
    with pytest.raises(ConfigError):
        plan.host("nope")
    with pytest.raises(ConfigError):
        plan_fabric("abc123", [f"n{i}" for i in range(300)], NET)


def test_commands_make_and_remove_every_part() -> None:
    plan = plan_fabric("abc123", ["a", "b"], NET)
    up = [" ".join(c) for c in up_commands(plan)]
    assert up[0] == "ip link add tlbabc123 type bridge"
    assert "ip -n tl-abc123-1 route add default via 10.201.7.1" in up
    down = [" ".join(c) for c in down_commands(plan)]
    assert down[-1] == "ip link del tlbabc123" and "ip netns del tl-abc123-0" in down


def test_a_subnet_in_use_is_skipped() -> None:
    first = pick_subnet("000001", lambda: "")
    again = pick_subnet("000001", lambda: f"3: br0 inet {str(first.network_address)[:-1]}1/24")
    assert again != first and again.prefixlen == 24


def test_links_are_shaped_both_ways_and_lose_packets_both_ways() -> None:
    plan = plan_fabric("abc123", ["dev", "edge"], NET)
    src = plan.host("dev")
    cmds = [" ".join(c) for c in link_commands(src, plan.gateway, 4000, 0x10, 12.5, 0.01)]
    assert ("ip netns exec tl-abc123-0 tc class add dev eth0 parent 1: classid 1:10 htb "
            "rate 12500kbit ceil 12500kbit") in cmds
    assert any("tc filter add dev tlvabc1230" in c and "ip sport 4000" in c for c in cmds)
    assert any("OUTPUT" in c and "--dport 4000" in c and "0.010000" in c for c in cmds)
    assert any("INPUT" in c and "--sport 4000" in c for c in cmds)
    assert link_commands(src, plan.gateway, 4000, 0x10, None, 0.0) == []
    assert len(qdisc_commands(plan, {"dev"})) == 2


def test_a_fabric_that_fails_half_way_is_removed() -> None:
    ran: list[str] = []

    def run(argv: Sequence[str]) -> None:
        ran.append(" ".join(argv))
        if argv[:3] == ["ip", "netns", "add"] and argv[3].endswith("-1"):
            raise NetnsError("no more namespaces")

    with pytest.raises(NetnsError):
        Fabric.create(["a", "b"], run=run, in_use=lambda: "")
    assert ran[-1].startswith("ip link del tlb")  # the bridge is removed again
    assert any(r.startswith("ip netns del tl-") and r.endswith("-0") for r in ran)
