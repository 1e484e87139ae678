"""Fleets of thousands from a fleet file's own nodes and links."""

from __future__ import annotations

from collections import Counter

import pytest

import sim_support as toy
from tierlink.errors import ConfigError
from tierlink.sim.generate import generate
from tierlink.sim.run import simulate
from tierlink.sim.workload import Arrivals, workload


def test_a_generated_fleet_copies_the_templates_and_spreads_the_links() -> None:
    big = generate(toy.fleet(), devices=100, edges=10, clouds=2)
    tiers = Counter(n.tier.label for n in big.nodes)
    assert tiers == {"device": 100, "edge": 10, "cloud": 2}
    dev = big.node("dev-42")
    assert dev.models == ("toy-small",) and big.routing == toy.fleet().routing
    per_edge = Counter(link.dst for link in big.links if link.src.startswith("dev-"))
    assert len(per_edge) == 10 and set(per_edge.values()) == {20}  # 2 edges a device
    up = [link for link in big.links if link.src == "edge-3"]
    assert [link.dst for link in up] == ["cloud-1"] and up[0].delay_ms == 40


def test_it_runs_and_refuses_what_cannot_be_copied() -> None:
    big = generate(toy.fleet(), devices=200, edges=8, clouds=2)
    devices = [n.node_id for n in big.nodes if n.tier.label == "device"]
    items = workload(Arrivals("poisson", 200.0), 5.0, devices, toy.N, seed=1)
    report, _ = simulate(big, toy.views(), toy.outcomes(), items, seed=1,
                         runs=[("tierlink", None)])
    run = report["runs"]["tierlink"]
    assert run["answered"] == len(items) and run["privacy_violations"] == 0
    with pytest.raises(ConfigError):
        generate(toy.fleet(), devices=0, edges=1, clouds=1)
