"""Where a node's battery and heat come from (the ``DeviceState`` its heartbeats and its own
placement use):

* a **state file** its environment writes (``device_state_file`` in the fleet file or the
  node spec): JSON ``{"battery": 0.42, "charging": false, "thermal": "nominal"}`` — what a
  phone's or a board's agent, or a test, hands the node;
* else **Linux's own files**: the first ``/sys/class/power_supply/*`` of type ``Battery``
  (``capacity`` in percent, ``status`` Charging / Full / Discharging) and the hottest
  ``/sys/class/thermal/thermal_zone*`` against its own trip points (``passive`` → fair,
  ``hot`` → serious, ``critical`` → critical);
* else nothing (a server on mains power without thermal zones: ``None``).

Read at most once per ``every_s`` (the view is rebuilt four times a second). A state file
that cannot be read or says something invalid is logged once and the last good state kept:
a node never fails on it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tierlink.core.types import THERMAL_LEVELS, DeviceState
from tierlink.errors import ConfigError

log = logging.getLogger(__name__)

_TRIPS = {"passive": "fair", "hot": "serious", "critical": "critical"}


class DeviceStateSource:
    """A node's :class:`DeviceState` now (see the module)."""

    def __init__(self, state_file: str | Path | None = None, *, sys_root: str | Path = "/sys",
                 every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.state_file = Path(state_file) if state_file else None
        self.sys_root = Path(sys_root)
        self.every_s, self._clock = every_s, clock
        self._state: DeviceState | None = None
        self._read_at = -float("inf")
        self._complained = False

    def read(self) -> DeviceState | None:
        now = self._clock()
        if now - self._read_at >= self.every_s:
            self._read_at = now
            self._state = self._from_file() if self.state_file else self._from_platform()
        return self._state

    def _from_file(self) -> DeviceState | None:
        assert self.state_file is not None
        try:
            state = parse_state(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None  # nothing reported (yet)
        except (OSError, ValueError, ConfigError) as exc:
            if not self._complained:
                log.warning("device state file %s: %s (keeping the last good state)",
                            self.state_file, exc)
                self._complained = True
            return self._state
        self._complained = False
        return state

    def _from_platform(self) -> DeviceState | None:
        battery, charging = _battery(self.sys_root / "class" / "power_supply")
        thermal = _thermal(self.sys_root / "class" / "thermal")
        if battery is None and thermal is None:
            return None
        return DeviceState(battery=battery, charging=charging, thermal=thermal or "nominal")


def parse_state(raw: Any) -> DeviceState:
    """A state file's JSON; :class:`ConfigError` naming what is wrong."""
    if not isinstance(raw, dict):
        raise ConfigError("expected a JSON object {battery, charging, thermal}")
    unknown = set(raw) - {"battery", "charging", "thermal"}
    if unknown:
        raise ConfigError(f"unknown keys {sorted(unknown)} (known: battery, charging, thermal)")
    battery = raw.get("battery")
    if battery is not None and (isinstance(battery, bool) or not isinstance(battery, int | float)
                                or not 0.0 <= battery <= 1.0):
        raise ConfigError(f"battery must be a charge from 0 to 1 (or null), got {battery!r}")
    charging = raw.get("charging", False)
    if not isinstance(charging, bool):
        raise ConfigError(f"charging must be true or false, got {charging!r}")
    thermal = raw.get("thermal", "nominal")
    if thermal not in THERMAL_LEVELS:
        raise ConfigError(f"thermal must be one of {', '.join(THERMAL_LEVELS)}, got {thermal!r}")
    return DeviceState(None if battery is None else float(battery), charging, thermal)


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _battery(supplies: Path) -> tuple[float | None, bool]:
    """The first battery's charge (0-1) and whether it charges; (None, False) without one."""
    for supply in sorted(supplies.glob("*")) if supplies.is_dir() else ():
        if _text(supply / "type") != "Battery":
            continue
        capacity = _text(supply / "capacity")
        if capacity is None or not capacity.isdigit():
            continue
        status = _text(supply / "status") or ""
        return min(int(capacity), 100) / 100.0, status in ("Charging", "Full")
    return None, False


def _thermal(root: Path) -> str | None:
    """The hottest level any thermal zone has reached by its own trip points; None
    without zones."""
    levels = []
    for zone in sorted(root.glob("thermal_zone*")) if root.is_dir() else ():
        temp = _text(zone / "temp")
        if temp is None or not temp.lstrip("-").isdigit():
            continue
        level = "nominal"
        for trip in zone.glob("trip_point_*_type"):
            kind = _text(trip)
            limit = _text(trip.with_name(trip.name.replace("_type", "_temp")))
            if kind in _TRIPS and limit and limit.lstrip("-").isdigit() \
                    and int(temp) >= int(limit) > 0 \
                    and THERMAL_LEVELS.index(_TRIPS[kind]) > THERMAL_LEVELS.index(level):
                level = _TRIPS[kind]
        levels.append(level)
    return max(levels, key=THERMAL_LEVELS.index) if levels else None
