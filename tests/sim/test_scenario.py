"""Scenario files: what they may say, and clear refusals of what they may not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlink.errors import ConfigError
from tierlink.sim.scenario import load_scenario, parse_scenario

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sim-scenario.yaml"


def test_the_example_scenario_reads() -> None:
    sf = load_scenario(EXAMPLE)
    assert sf.duration_s == 600 and sf.arrivals is not None
    assert sf.arrivals.kind == "diurnal" and sf.arrivals.bursts[0].factor == 3
    assert sf.scenario.outages["edge-1->cloud-1"] == ((200.0, 260.0),)
    assert sf.scenario.crashes["edge-2"] == ((300.0, 340.0),)
    assert sf.scenario.slow["edge-1"] == ((400.0, 500.0, 4.0),)


@pytest.mark.parametrize("raw", [
    {"outage": {}},                                   # a typo
    {"crashes": {"edge-1": [[5, 2]]}},                # ends before it starts
    {"slow": {"edge-1": [[1, 2]]}},                   # no factor
    {"arrivals": {"kind": "weekly"}},                 # unknown process
    {"arrivals": {"kind": "poisson", "rate_per_s": 0}},
    {"duration_s": -1},
    [1, 2],
])
def test_bad_scenarios_are_refused(raw: object) -> None:
    with pytest.raises(ConfigError):
        parse_scenario(raw)


def test_a_scenario_naming_a_missing_node_is_refused() -> None:
    import asyncio

    import sim_support as toy
    from tierlink.sim import loop
    from tierlink.sim.build import Scenario, build

    async def main() -> None:
        build(toy.fleet(), toy.views(), {"toy": toy.outcomes()},
              asyncio.get_running_loop().time, 1, Scenario(crashes={"edge-9": ((1.0, 2.0),)}))

    with pytest.raises(ConfigError, match="edge-9"):
        loop.run(main)
