"""Simulated runs of a small fleet: the nodes' own policy code plans them, privacy holds
where the policy respects it, runs are reproducible, and faults are felt and survived."""

from __future__ import annotations

import asyncio
import random

import pytest

import sim_support as toy
from tierlink.core.types import Privacy, Request
from tierlink.node.dispatcher import Dispatcher
from tierlink.policy import REGISTRY
from tierlink.policy.placement import TierlinkPolicy
from tierlink.routing.desk import PolicyDesk
from tierlink.sim import loop
from tierlink.sim.build import Scenario, build
from tierlink.sim.run import run_once, simulate
from tierlink.sim.workload import Arrivals, workload


def _items(n: int = 600, rate: float = 25.0) -> list:
    return workload(Arrivals("constant", rate), n / rate, ["dev-1", "dev-2"], toy.N, seed=5)


def test_the_simulator_plans_with_the_nodes_policy_code() -> None:
    config, outcomes = toy.fleet(), toy.outcomes()

    async def main() -> None:
        clock = asyncio.get_running_loop().time
        fleet, _ = build(config, toy.views(), {"toy": outcomes}, clock, seed=1)
        node = fleet.nodes["dev-1"]
        fleet.view_of(node)
        policy = node.desk.for_request(Request("r", "toy", 10.0, "dev-1"))
        assert type(policy) is TierlinkPolicy and node.desk.named("tierlink") is policy
        assert type(node.desk) is PolicyDesk  # the live node's desk
        assert type(node.dispatcher) is Dispatcher
        # a policy made as a live node makes it plans the same for the same view
        live = REGISTRY.create("tierlink", config.routing.policy_config())
        for privacy in Privacy:
            for deadline in (20.0, 150.0, 1000.0):
                req = Request("r", "toy", deadline, "dev-1", privacy, input_bytes=3136)
                assert policy.plan(req, node.view, random.Random(0)) == \
                    live.plan(req, node.view, random.Random(0))
        assert {m.name for n in node.view.nodes.values() for m in n.models} == {
            "toy-small", "toy-medium", "toy-large"}

    loop.run(main)


def test_runs_compare_as_the_demo_does_and_repeat_exactly() -> None:
    config, outcomes, items = toy.fleet(), toy.outcomes(), _items()
    report, records = simulate(config, toy.views(), outcomes, items, seed=1)
    runs = report["runs"]
    assert runs["tierlink"]["privacy_violations"] == 0
    # cloud_only ignores privacy by design: the routers refuse those plans, nothing leaks
    assert runs["cloud_only"]["privacy_violations"] == 0
    assert runs["cloud_only"]["privacy_refusals"] > 0 == runs["tierlink"]["privacy_refusals"]
    assert runs["device_only"]["tier_share"]["device"] == 1.0
    assert runs["tierlink"]["accuracy"] > runs["device_only"]["accuracy"]
    assert runs["tierlink"]["sla_attainment"] >= runs["cloud_only"]["sla_attainment"]
    assert 0 < runs["tierlink"]["tier_share"]["device"] < 1
    assert set(runs["tierlink"]["by_privacy"]) == {"local", "site", "any"}
    assert all(len(r) == len(items) for r in records.values())
    again, _ = simulate(config, toy.views(), outcomes, items, seed=1)
    assert again["runs"] == report["runs"]


def test_a_run_that_keeps_no_records_reports_the_same_summary() -> None:
    config, outcomes = toy.fleet(), toy.outcomes()
    items = _items()
    kept = run_once(config, toy.views(), outcomes, items, None, seed=3)
    heard: list[object] = []
    lean = run_once(config, toy.views(), outcomes, items, None, seed=3,
                    on_done=heard.append, keep_records=False)
    assert lean.records == [] and len(heard) == len(kept.records) == len(items)
    cost = lean.summary.pop("cost_per_1k")  # summed in the order answers came
    assert cost == pytest.approx(kept.summary.pop("cost_per_1k"), rel=1e-12)
    assert lean.summary == kept.summary


def test_a_crashed_edge_and_a_dead_link_are_felt_and_survived() -> None:
    config, outcomes, items = toy.fleet(), toy.outcomes(), _items(1200, 40.0)
    calm, _ = simulate(config, toy.views(), outcomes, items, seed=2, runs=[("tierlink", None)])
    storm = Scenario(crashes={"edge-1": ((5.0, 20.0),)},
                     outages={"edge-2->cloud-1": ((10.0, 25.0),)})
    rough, records = simulate(config, toy.views(), outcomes, items, seed=2,
                              runs=[("tierlink", None)], scenario=storm)
    r, c = rough["runs"]["tierlink"], calm["runs"]["tierlink"]
    assert c["answered"] == len(items) and r["lost"] == 0 and r["answered"] + r["refused"] == len(items)
    assert sum(rough["sim"]["tierlink"]["fallbacks"].values()) > sum(
        calm["sim"]["tierlink"]["fallbacks"].values())
    during = [x for x in records["tierlink"] if 6.0 <= x.item.at_s < 19.0 and x.answered]
    assert during and not any(x.served_by == "edge-1" for x in during)  # it was down
    assert r["answered"] >= 0.95 * len(items)


def test_the_learning_policy_runs_in_the_simulator_and_learns_there() -> None:
    config, outcomes, items = toy.fleet(), toy.outcomes(), _items(400)

    async def main() -> int:
        from tierlink.sim.fleet import drive

        fleet, _ = build(config, toy.views(), {"toy": outcomes},
                         asyncio.get_running_loop().time, seed=1)
        records = await drive(fleet, items, "toy", outcomes.labels.tolist(),
                              outcomes.input_bytes, "bandit")
        assert all(r.answered for r in records)
        return sum(n.desk.named("bandit").model.updates  # type: ignore[attr-defined]
                   for n in fleet.nodes.values())

    assert loop.run(main) >= len(items)  # every request taught the node that planned it
