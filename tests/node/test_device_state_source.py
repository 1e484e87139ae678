"""A node's battery and heat: from the state file its environment writes, else from
Linux's power-supply and thermal-zone files, else none; read at most once a second; a bad
file is logged once and the last good state kept."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tierlink.core.types import DeviceState
from tierlink.errors import ConfigError
from tierlink.node.device_state import DeviceStateSource, parse_state


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_state_file_is_read_at_most_once_a_second(tmp_path: Path) -> None:
    path, clock = tmp_path / "state.json", Clock()
    source = DeviceStateSource(path, clock=clock, sys_root=tmp_path / "no-sys")
    assert source.read() is None  # nothing written yet: nothing reported
    path.write_text(json.dumps({"battery": 0.15, "charging": False, "thermal": "fair"}))
    clock.t += 0.5
    assert source.read() is None  # not yet looked again
    clock.t += 0.5
    assert source.read() == DeviceState(0.15, False, "fair")


def test_a_bad_state_file_keeps_the_last_good_state_and_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, clock = tmp_path / "state.json", Clock()
    path.write_text('{"battery": 0.5}')
    source = DeviceStateSource(path, clock=clock)
    assert source.read() == DeviceState(0.5)
    caplog.set_level(logging.WARNING, "tierlink.node.device_state")
    for bad in ('{"battery": 1.5}', "not json", '{"batery": 0.2}'):
        path.write_text(bad)
        clock.t += 1.0
        assert source.read() == DeviceState(0.5)
    assert len(caplog.records) == 1 and "battery must be" in caplog.text


@pytest.mark.parametrize(("raw", "match"), [
    ([], "JSON object"), ({"battery": True}, "battery"), ({"battery": -0.1}, "battery"),
    ({"charging": "yes"}, "charging"), ({"thermal": "warm"}, "thermal"),
    ({"heat": 1}, "unknown keys")])
def test_what_a_state_file_may_say(raw: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_state(raw)
    assert parse_state({"battery": None}) == DeviceState()


def _sys(root: Path, *, capacity: str | None = "34", status: str = "Discharging",
         zones: tuple[tuple[int, dict[str, int]], ...] = ()) -> Path:
    supplies = root / "class" / "power_supply"
    (supplies / "AC").mkdir(parents=True)
    (supplies / "AC" / "type").write_text("Mains\n")
    if capacity is not None:
        (supplies / "BAT0").mkdir()
        (supplies / "BAT0" / "type").write_text("Battery\n")
        (supplies / "BAT0" / "capacity").write_text(capacity + "\n")
        (supplies / "BAT0" / "status").write_text(status + "\n")
    for i, (temp, trips) in enumerate(zones):
        zone = root / "class" / "thermal" / f"thermal_zone{i}"
        zone.mkdir(parents=True)
        (zone / "temp").write_text(f"{temp}\n")
        for j, (kind, limit) in enumerate(trips.items()):
            (zone / f"trip_point_{j}_type").write_text(kind + "\n")
            (zone / f"trip_point_{j}_temp").write_text(f"{limit}\n")
    return root


def test_linux_s_battery_and_thermal_zones(tmp_path: Path) -> None:
    trips = {"passive": 70_000, "hot": 85_000, "critical": 100_000}
    root = _sys(tmp_path / "a", zones=((45_000, trips), (88_000, trips)))
    assert DeviceStateSource(sys_root=root).read() == DeviceState(0.34, False, "serious")
    root = _sys(tmp_path / "b", status="Charging", zones=((71_000, trips),))
    assert DeviceStateSource(sys_root=root).read() == DeviceState(0.34, True, "fair")
    root = _sys(tmp_path / "c", capacity=None, zones=((30_000, trips),))
    assert DeviceStateSource(sys_root=root).read() == DeviceState(None, False, "nominal")
    root = _sys(tmp_path / "d", capacity=None)  # mains power, no zones: nothing to say
    assert DeviceStateSource(sys_root=root).read() is None
