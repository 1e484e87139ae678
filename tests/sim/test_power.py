"""Devices' batteries and heat: power saving, an empty battery that shuts the device down
for good, thermal throttling with hysteresis — and a fleet that feels them."""

from __future__ import annotations

from dataclasses import replace

import pytest

import sim_support as toy
from tierlink.core.types import DeviceState
from tierlink.errors import ConfigError
from tierlink.sim.build import Scenario
from tierlink.sim.power import Battery, DevicePower, PowerState, Thermal
from tierlink.sim.run import simulate
from tierlink.sim.scenario import parse_scenario
from tierlink.sim.workload import Arrivals, workload


def test_a_battery_drains_saves_power_then_shuts_the_device_down() -> None:
    died: list[bool] = []
    state = PowerState(DevicePower(battery=Battery(100.0, idle_w=1.0, active_w=9.0,
                                                   saver_below=0.5, saver_speed=0.25)),
                       on_empty=lambda: died.append(True))
    state.advance(10.0, busy_s=2.0)  # 10 s at 1 W + 2 s at 9 W more
    assert state.energy_j == pytest.approx(28.0) and state.factor() == 1.0
    state.advance(35.0)
    assert state.charge_j == pytest.approx(47.0) and state.factor() == 0.25
    assert not died
    state.advance(100.0)
    assert state.empty and died == [True]
    state.advance(200.0)
    assert died == [True] and state.energy_j == pytest.approx(118.0)  # no drain once flat


def test_heat_throttles_with_hysteresis() -> None:
    state = PowerState(DevicePower(thermal=Thermal(cool_per_s=0.5, hot_at=4.0, cool_at=1.0,
                                                   throttled_speed=0.5)))
    state.advance(5.0, busy_s=5.0)  # +5 heat, -2.5 cooling
    assert state.heat == pytest.approx(2.5) and not state.hot
    state.advance(8.0, busy_s=3.0)
    assert state.heat == pytest.approx(4.0) and state.hot and state.factor() == 0.5
    state.advance(10.0)  # cools to 3: still over cool_at, still throttled
    assert state.hot and state.throttled_s == pytest.approx(2.0)
    state.advance(16.0)
    assert state.heat == 0.0 and not state.hot and state.factor() == 1.0


def test_bad_power_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="battery"):
        Battery(capacity_j=0)
    with pytest.raises(ConfigError, match="thermal"):
        Thermal(hot_at=1.0, cool_at=2.0)
    with pytest.raises(ConfigError, match="unknown key"):
        parse_scenario({"power": {"batery": {}}})
    parsed = parse_scenario({"power": {"devices": ["dev-1"], "battery": {"capacity_j": 50}}})
    assert parsed.scenario.power == DevicePower(Battery(capacity_j=50.0), None, ("dev-1",))


def test_a_fleet_feels_flat_batteries_and_hot_chips() -> None:
    items = workload(Arrivals("constant", 20.0), 30.0, ["dev-1", "dev-2"], toy.N, seed=5)
    runs = (("device_only", "device_only"),)
    # dev-1's battery lasts ~10 s; both devices heat up fast and throttle hard
    power = DevicePower(battery=Battery(capacity_j=10.0, idle_w=1.0, active_w=0.0),
                        thermal=Thermal(cool_per_s=0.001, hot_at=0.002, cool_at=0.001,
                                        throttled_speed=0.1))
    base, _ = simulate(toy.fleet(), toy.views(), toy.outcomes(), items, 1, runs)
    drained, records = simulate(toy.fleet(), toy.views(), toy.outcomes(), items, 1, runs,
                          replace(Scenario(), power=replace(power, devices=("dev-1",))))
    run, sim = drained["runs"]["device_only"], drained["sim"]["device_only"]["power"]
    assert sim["empty"] == ["dev-1"] and sim["devices"] == 1
    from_dev1 = sum(i.origin == "dev-1" for i in items)
    assert from_dev1 // 2 < run["lost"] + run["refused"] < from_dev1  # after ~10 s of 30
    assert base["runs"]["device_only"]["lost"] == 0
    answered = [r.latency_ms for r in records["device_only"]
                if r.item.origin == "dev-1" and r.answered]
    assert sim["throttled_s"] > 5 and answered
    median = sorted(answered)[len(answered) // 2]  # hot after its first few requests
    assert median > 5 * base["runs"]["device_only"]["p50_ms"]  # at 0.1 of its speed


def test_a_device_reports_its_charge_to_the_percent_and_its_heat_as_a_level() -> None:
    state = PowerState(DevicePower(battery=Battery(100.0, idle_w=1.0, active_w=0.0),
                                   thermal=Thermal(cool_per_s=0.5, hot_at=4.0, cool_at=1.0)))
    assert state.device_state(0.0) == DeviceState(1.0, False, "nominal")
    assert state.device_state(12.5) == DeviceState(0.87, False, "nominal")  # not advanced
    assert state.charge_j == 100.0
    state.advance(14.0, busy_s=3.0)  # heat 3 - 7 * 0.5... = 3 - 3.5 < 0: cool
    state.advance(20.0, busy_s=6.0)  # heat 6 - 3 = 3: past cool_at, not yet hot
    assert state.device_state(20.0).thermal == "fair"
    state.advance(24.0, busy_s=4.0)  # 3 + 4 - 2 = 5: hot
    assert state.device_state(24.0) == DeviceState(0.76, False, "serious")


def test_sparing_a_low_battery_makes_it_last_longer() -> None:
    """The fleet's ``routing.device_state`` rule in the simulator: devices that send their
    work upstream once low keep their charge longer than devices that do not, with the
    same requests; the run reports a timeline of the batteries."""
    items = workload(Arrivals("constant", 40.0), 60.0, ["dev-1", "dev-2"], toy.N, seed=5)
    power = DevicePower(battery=Battery(capacity_j=60.0, idle_w=0.1, active_w=100.0))
    runs = (("tierlink", None),)
    results = {}
    for name, rule in (("aware", {}), ("unaware", {"device_state": {"low_battery": 0}})):
        report, _ = simulate(toy.fleet(**rule), toy.views(), toy.outcomes(), items, 1, runs,
                             replace(Scenario(), power=power))
        results[name] = report
    aware = results["aware"]["sim"]["tierlink"]["power"]
    unaware = results["unaware"]["sim"]["tierlink"]["power"]
    assert aware["first_empty_s"] is None and aware["mean_charge_share"] > 0.05
    assert unaware["first_empty_s"] < 55 and unaware["mean_charge_share"] == 0.0
    sla = {name: r["runs"]["tierlink"]["sla_attainment"] for name, r in results.items()}
    assert sla["aware"] >= 0.99 and sla["unaware"] < sla["aware"] - 0.1  # flat: lost
    assert len(aware["timeline"]) > 50 and aware["timeline"][0]["mean_charge"] > 0.95
