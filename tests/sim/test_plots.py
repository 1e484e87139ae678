"""The simulation's PNG: latency, SLA and tier shares over simulated time, and a fourth
panel with the devices' mean charge when they run on batteries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PIL import Image

import sim_support as toy
from tierlink.sim.build import Scenario
from tierlink.sim.plots import plot
from tierlink.sim.power import Battery, DevicePower
from tierlink.sim.run import simulate
from tierlink.sim.workload import Arrivals, workload


def test_the_png_shows_the_batteries_when_devices_have_them(tmp_path: Path) -> None:
    items = workload(Arrivals("constant", 20.0), 20.0, ["dev-1", "dev-2"], toy.N, seed=2)
    power = DevicePower(battery=Battery(capacity_j=50.0, idle_w=0.1, active_w=100.0))
    report, records = simulate(toy.fleet(), toy.views(), toy.outcomes(), items, 1,
                               (("tierlink", None),), replace(Scenario(), power=power))
    timeline = report["sim"]["tierlink"]["power"]["timeline"]
    plain, powered = tmp_path / "plain.png", tmp_path / "powered.png"
    plot(records, plain)
    plot(records, powered, batteries={"tierlink": timeline})
    heights = [Image.open(p).size[1] for p in (plain, powered)]
    assert heights[1] > heights[0] * 1.2  # a fourth panel
