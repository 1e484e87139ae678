"""The third-party policy package of ``examples/policies/`` (installed with ``pip install -e``
by setup): registered by its entry point, named with options in a fleet file, planning a
simulated fleet's requests with tierlink's constraints and learning from the answers."""

from __future__ import annotations

import asyncio

import pytest

import sim_support as toy
from tierlink.core.types import Privacy
from tierlink.errors import ConfigError
from tierlink.policy import REGISTRY, Learner
from tierlink.sim import loop
from tierlink.sim.build import build
from tierlink.sim.fleet import drive
from tierlink.sim.workload import Arrivals, workload

POLICY = {"name": "cheapest_accurate", "options": {"max_drop": 2.0, "min_samples": 5}}


def test_the_package_registers_its_policy_by_entry_point() -> None:
    from tierlink_example_policies import CheapestAccurate

    assert "cheapest_accurate" in REGISTRY.names()
    made = REGISTRY.create("cheapest_accurate", None, POLICY["options"])
    assert isinstance(made, CheapestAccurate) and isinstance(made, Learner)
    assert (made.max_drop, made.min_samples) == (0.02, 5)
    with pytest.raises(ConfigError, match="max_drop must be points"):
        REGISTRY.create("cheapest_accurate", None, {"max_drop": -1})


def test_a_fleet_runs_on_it_and_it_learns_from_the_answers() -> None:
    config, outcomes = toy.fleet(policy=POLICY), toy.outcomes()
    items = workload(Arrivals("constant", 25.0), 12.0, ["dev-1", "dev-2"], toy.N, seed=5)

    async def main() -> tuple[list, dict]:
        fleet, _ = build(config, toy.views(), {"toy": outcomes},
                         asyncio.get_running_loop().time, seed=1)
        records = await drive(fleet, items, "toy", outcomes.labels.tolist(),
                              outcomes.input_bytes, None)
        return records, {n: node.desk.default for n, node in fleet.nodes.items()}

    records, policies = loop.run(main)
    assert all(type(p).__name__ == "CheapestAccurate" for p in policies.values())
    assert all(r.answered for r in records)
    local = [r for r in records if r.item.privacy is Privacy.LOCAL]
    assert local and all(r.served_by == r.item.origin for r in local)  # constraints held
    learned = {m: seen for n in ("dev-1", "dev-2") for m, seen in policies[n].seen.items()}
    assert learned.get("toy-small", [0, 0])[1] >= 5  # the devices saw their model answer
