"""HTTP costs of a simulated fleet: drawn from measured values, measured from a live run's
request log, and felt by the requests that pay them."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

import sim_support as toy
from tierlink.core.types import Priority, Privacy
from tierlink.errors import ConfigError
from tierlink.fleet.requestlog import LoggedRequest
from tierlink.fleet.workload import WorkItem
from tierlink.sim.build import Scenario
from tierlink.sim.http import HttpCosts, costs_from_log
from tierlink.sim.run import simulate
from tierlink.sim.workload import Arrivals, workload


def test_costs_are_drawn_from_the_measured_values() -> None:
    costs = HttpCosts.of([1.0, 3.0], 2.0)
    rng = random.Random(1)
    drawn = {costs.request_s(rng) for _ in range(50)}
    assert drawn == {0.001, 0.003} and costs.hop_s(rng) == 0.002
    assert HttpCosts().free and not costs.free
    assert costs.summary()["request_ms"]["n"] == 2
    with pytest.raises(ConfigError, match="hop_ms"):
        HttpCosts.of(1.0, [-1.0])
    with pytest.raises(ConfigError, match="request_ms"):
        HttpCosts.of([], 1.0)


def _entry(seq: int, served_by: str, latency: float, timings: dict[str, float]
           ) -> LoggedRequest:
    item = WorkItem(seq, seq, "dev-1", 150.0, Priority.INTERACTIVE, Privacy.ANY, seq * 0.04)
    tier = "device" if served_by == "dev-1" else "edge"
    return LoggedRequest("tierlink", item, True, latency, tier, served_by, timings)


def test_costs_are_measured_from_a_live_log() -> None:
    local = [_entry(i, "dev-1", 2.0 + 0.01 * i, {"compute_ms": 0.2}) for i in range(40)]
    # one hop up: 10 ms round trip, 3136 B each way at 100 Mbit/s (0.25 ms), 1 ms upstream
    remote = [_entry(100 + i, "edge-1", 2.0 + 10.0 + 0.502 + 1.0 + 3.0, {"server_ms": 1.0})
              for i in range(30)]
    costs = costs_from_log(local + remote, toy.fleet(), 3136)
    assert len(costs.request_ms) == 40 and min(costs.request_ms) == pytest.approx(1.8)
    median_request = sorted(costs.request_ms)[20]  # statistics.median of 40: the mean of two
    assert costs.hop_ms == pytest.approx([3.0 + 2.0 - median_request + 0.005] * 30, abs=0.01)
    with pytest.raises(ConfigError, match="answered one hop up"):
        costs_from_log(local, toy.fleet(), 3136)
    with pytest.raises(ConfigError, match="a device answered itself"):
        costs_from_log(remote, toy.fleet(), 3136)


def test_requests_pay_what_the_scenario_says() -> None:
    items = workload(Arrivals("constant", 20.0), 10.0, ["dev-1", "dev-2"], toy.N, seed=5)
    runs = (("device_only", "device_only"), ("static_rules", "static_rules"))
    free, _ = simulate(toy.fleet(), toy.views(), toy.outcomes(), items, 1, runs)
    paid, _ = simulate(toy.fleet(), toy.views(), toy.outcomes(), items, 1, runs,
                       replace(Scenario(), http=HttpCosts.of(2.0, 4.0)))
    local = paid["runs"]["device_only"]["p50_ms"] - free["runs"]["device_only"]["p50_ms"]
    assert local == pytest.approx(2.0, abs=0.05)
    forwarded = [paid["runs"]["static_rules"]["by_privacy"]["site"]["p95_ms"],
                 free["runs"]["static_rules"]["by_privacy"]["site"]["p95_ms"]]
    assert forwarded[0] - forwarded[1] == pytest.approx(6.0, abs=0.5)  # request + one hop


def test_the_measured_defaults_are_what_live_runs_paid_and_round_trip(tmp_path) -> None:
    """``tierlink sim`` with no calibration option uses them: a simulated request costs what
    a real one does on the demo's fleet, not the model's compute alone."""
    from tierlink.sim.http import measured_defaults, write_defaults

    found = measured_defaults()
    assert found.provenance["live_runs"] >= 3
    assert 0.0 < found.compute_overhead_ms < 5.0  # the node's work around a model run
    assert 1.0 < sorted(found.pooled.request_ms)[len(found.pooled.request_ms) // 2] < 20.0
    assert {"tierlink", "static_rules", "cloud_only", "device_only"} <= set(found.by_run)
    path = tmp_path / "defaults.json"
    many = HttpCosts.of([float(i) for i in range(1000)], [1.0, 2.0])
    write_defaults(path, many, {"tierlink": many}, {"live_runs": 3})
    import json

    data = json.loads(path.read_text())
    assert len(data["pooled"]["request_ms"]) == 100  # the spread, in a fixed number of values
    assert data["pooled"]["request_ms"][0] < 10 and data["pooled"]["request_ms"][-1] > 990
    assert data["pooled"]["hop_ms"] == [1.0, 2.0]


def test_a_model_run_pays_the_nodes_overhead_beside_its_card() -> None:
    from tierlink.sim.compute import ComputeModel
    from tierlink.sim.scenario import parse_scenario

    plain, loaded = ComputeModel(speed=0.5, jitter=0.0), ComputeModel(speed=0.5, jitter=0.0,
                                                                       overhead_ms=0.2)
    rng = random.Random(0)
    assert plain.seconds(1.0, rng) == pytest.approx(0.002)
    assert loaded.seconds(1.0, rng) == pytest.approx(0.0022)
    parsed = parse_scenario({"compute_overhead_ms": 0.3})
    assert parsed.scenario.compute_overhead_ms == 0.3 and parsed.overhead_given
    assert not parse_scenario({}).overhead_given
    with pytest.raises(ConfigError, match="compute_overhead_ms"):
        parse_scenario({"compute_overhead_ms": -1})
