"""Hot spots the users of request routers report, on the simulator (the nodes' own policy
and dispatcher code): many devices acting on the same stale view do not all pile onto the
node that view calls best; a burst's escalations do not pile up on the edges."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import sim_support as toy
from tierlink.core.types import Priority, Privacy
from tierlink.fleet.config import FleetConfig, parse_fleet
from tierlink.sim.build import Scenario
from tierlink.sim.run import RunResult, run_once
from tierlink.sim.workload import Arrivals, Burst, workload

DEVICES = [f"dev-{i}" for i in range(1, 41)]
EDGES = [f"edge-{i}" for i in range(1, 7)]


def fleet() -> object:
    """40 devices with no model of their own, six edges, a cloud: every request goes up."""
    return parse_fleet({
        "name": "stale", "seed": 3,
        "routing": {"policy": "tierlink", "thresholds": {"toy-medium": 0.9}},
        "nodes": [{"id": "cloud-1", "tier": "cloud", "models": ["toy-large"], "workers": 4},
                  *({"id": e, "tier": "edge", "models": ["toy-medium"]} for e in EDGES),
                  *({"id": d, "tier": "device", "models": []} for d in DEVICES)],
        "links": [{"from": DEVICES, "to": EDGES, "delay_ms": 5, "bandwidth_mbit": 100},
                  {"from": EDGES, "to": "cloud-1", "delay_ms": 40, "bandwidth_mbit": 50}]})


def test_devices_on_one_stale_view_do_not_all_pick_its_best_node() -> None:
    """edge-1 is four times as fast as the others, so every device's snapshot — refreshed
    only every 5 s, the same for all of them — calls it the best; a burst of 10 s at a rate
    the fast edge alone cannot carry must still spread over the edges (power of two choices
    over the feasible set), not queue on edge-1."""
    items = [replace(i, privacy=Privacy.SITE, priority=Priority.INTERACTIVE,
                     deadline_ms=500.0)
             for i in workload(Arrivals("constant", 600.0), 10.0, DEVICES, toy.N, seed=2)]
    scenario = Scenario(speed={"edge-1": 4.0}, heartbeat_s=5.0, view_refresh_s=5.0,
                        jitter=0.0)
    result = run_once(fleet(), toy.views(), toy.outcomes(), items, None, seed=1,
                      scenario=scenario)
    answered = Counter(r.served_by for r in result.records if r.answered)
    on_edges = {e: answered[e] for e in EDGES}
    total = sum(on_edges.values())
    assert total > 0.8 * len(items), answered
    assert on_edges["edge-1"] < 0.45 * total, on_edges  # the "best" one: its pairs' winner
    assert min(on_edges.values()) > 0.05 * total, on_edges  # every edge takes its share
    assert result.summary["sla_attainment"] > 0.95


def burst_fleet(escalation_queue: int) -> FleetConfig:
    """20 devices with a small model at half a core, four edges, a cloud: the tuned cascade
    escalates what a device is unsure of to an edge (one worker each)."""
    devices, edges = DEVICES[:20], EDGES[:4]
    return parse_fleet({
        "name": "burst", "seed": 3,
        "routing": {"policy": "tierlink", "thresholds": {"toy-small": 0.9, "toy-medium": 0.9}},
        "nodes": [{"id": "cloud-1", "tier": "cloud", "models": ["toy-large"], "workers": 4},
                  *({"id": e, "tier": "edge", "models": ["toy-medium"],
                     "escalation_queue": escalation_queue} for e in edges),
                  *({"id": d, "tier": "device", "models": ["toy-small"], "cpu_quota": 0.5}
                    for d in devices)],
        "links": [{"from": devices, "to": edges, "delay_ms": 5, "bandwidth_mbit": 100},
                  {"from": edges, "to": "cloud-1", "delay_ms": 40, "bandwidth_mbit": 50}]})


def test_a_burst_of_escalations_is_shed_at_the_escalation_queue_not_queued() -> None:
    """Ten times the rate for 2 s: unchecked, the escalations queue 10 deep on an edge; with
    ``escalation_queue: 2`` no edge holds more than 2 waiting, and what is shed keeps the
    device's answer or goes to another edge: every request answered in time, accuracy
    within half a point."""
    items = workload(Arrivals("poisson", 300.0, bursts=(Burst(2.0, 4.0, 10.0),)), 6.0,
                     DEVICES[:20], toy.N, seed=1)

    def run(escalation_queue: int) -> RunResult:
        return run_once(burst_fleet(escalation_queue), toy.views(), toy.outcomes(), items,
                        None, seed=1, scenario=Scenario())

    unchecked, shed = run(256), run(2)
    edge_peaks = [{e: r.counters["peak_queue"].get(e, 0) for e in EDGES[:4]}
                  for r in (unchecked, shed)]
    assert max(edge_peaks[0].values()) > 5, edge_peaks
    assert max(edge_peaks[1].values()) <= 2, edge_peaks
    assert shed.counters["fallbacks"].get("escalation_shed", 0) > 50
    for r in (unchecked, shed):
        assert r.summary["sla_attainment"] == 1.0 and r.summary["lost"] == 0
    assert shed.summary["accuracy"] > unchecked.summary["accuracy"] - 0.005
