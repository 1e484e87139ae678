"""Independent simulated runs spread over local processes give the runs one process gives,
record for record; a fleet configuration travels to them as its fleet file."""

from __future__ import annotations

import pickle

import sim_support as toy
from tierlink.sim.run import Spread, simulate
from tierlink.sim.workload import Arrivals, workload

RUNS = (("tierlink", None), ("cloud_only", "cloud_only"), ("device_only", "device_only"))


def test_a_fleet_configuration_pickles_as_its_fleet_file() -> None:
    config = toy.fleet()
    assert pickle.loads(pickle.dumps(config)) == config


def test_runs_on_worker_processes_match_the_runs_in_this_one() -> None:
    items = workload(Arrivals("constant", 25.0), 12.0, ["dev-1", "dev-2"], toy.N, seed=2)
    heard: list[str] = []
    here, here_records = simulate(toy.fleet(), toy.views(), toy.outcomes(), items, seed=4,
                                  runs=RUNS)
    there, there_records = simulate(toy.fleet(), toy.views(), toy.outcomes(), items, seed=4,
                                    runs=RUNS, spread=Spread(workers=2),
                                    on_done=lambda name, _r: heard.append(name))
    assert here["runs"] == there["runs"]
    for name, _policy in RUNS:
        assert [(r.item, r.served_by, r.latency_ms) for r in here_records[name]] == \
            [(r.item, r.served_by, r.latency_ms) for r in there_records[name]]
    assert len(heard) == len(RUNS) * len(items)  # every record reported, when its run is back
