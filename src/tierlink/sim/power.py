"""A device's battery and heat on simulated time: what makes a phone slower as the day goes.

* **Battery** drains at ``idle_w`` always and ``active_w`` while a model computes. Below
  ``saver_below`` of its capacity the device saves power (its compute runs at
  ``saver_speed``); empty, it shuts down (a crash that never restarts).
* **Heat** (a unitless load on the chip) grows by one per busy second and falls by
  ``cool_per_s`` per second; over ``hot_at`` the device throttles its CPU to
  ``throttled_speed`` until it has cooled to ``cool_at`` (hysteresis, as real governors do).

No timers: the state is brought up to date whenever the node computes (time passed since
the last update drains and cools it), so 10,000 idle devices cost nothing. The node's
scheduler learns the slower service times as a live node does, and the policies plan with
them through the view.

A device reports what a live one reads from its platform (:meth:`PowerState.device_state`):
its charge (to the percent) and its heat as a thermal level — ``serious`` while throttled,
``fair`` once past the level it cools back to — so the fleet's ``routing.device_state``
rule spares a low or hot device's compute as on a live fleet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tierlink.core.types import DeviceState
from tierlink.errors import ConfigError

__all__ = ["Battery", "DevicePower", "PowerState", "Thermal"]


@dataclass(frozen=True, slots=True)
class Battery:
    capacity_j: float = 20_000.0
    idle_w: float = 0.3
    active_w: float = 3.0
    saver_below: float = 0.2  # share of the capacity under which power saving starts
    saver_speed: float = 0.5

    def __post_init__(self) -> None:
        if not (self.capacity_j > 0 and self.idle_w >= 0 and self.active_w >= 0
                and 0 <= self.saver_below < 1 and 0 < self.saver_speed <= 1):
            raise ConfigError("battery: capacity_j > 0, idle_w and active_w >= 0, "
                              "saver_below in [0, 1), saver_speed in (0, 1]")


@dataclass(frozen=True, slots=True)
class Thermal:
    cool_per_s: float = 0.2
    hot_at: float = 5.0
    cool_at: float = 2.0
    throttled_speed: float = 0.4

    def __post_init__(self) -> None:
        if not (self.cool_per_s > 0 and 0 <= self.cool_at < self.hot_at
                and 0 < self.throttled_speed <= 1):
            raise ConfigError("thermal: cool_per_s > 0, 0 <= cool_at < hot_at, "
                              "throttled_speed in (0, 1]")


@dataclass(frozen=True, slots=True)
class DevicePower:
    """Which devices (``None``: every device) have a battery and/or heat up."""

    battery: Battery | None = None
    thermal: Thermal | None = None
    devices: tuple[str, ...] | None = None

    def applies_to(self, node_id: str) -> bool:
        return self.devices is None or node_id in self.devices


@dataclass
class PowerState:
    """One device's battery and heat; :meth:`factor` is what they leave of its speed."""

    power: DevicePower
    at: float = 0.0
    charge_j: float = field(init=False)
    heat: float = 0.0
    hot: bool = False
    energy_j: float = 0.0
    throttled_s: float = 0.0
    on_empty: Callable[[], None] = lambda: None
    empty_at: float | None = None  # when the battery went flat
    peak_heat: float = 0.0

    def __post_init__(self) -> None:
        self.charge_j = self.power.battery.capacity_j if self.power.battery else 0.0

    @property
    def empty(self) -> bool:
        return self.power.battery is not None and self.charge_j <= 0.0

    def factor(self) -> float:
        f = 1.0
        b = self.power.battery
        if b is not None and self.charge_j < b.saver_below * b.capacity_j:
            f *= b.saver_speed
        if self.power.thermal is not None and self.hot:
            f *= self.power.thermal.throttled_speed
        return f

    def charge_at(self, now: float) -> float:
        """The battery's share of its capacity at ``now`` (idle since the last update),
        without changing anything; 1.0 without a battery."""
        b = self.power.battery
        if b is None:
            return 1.0
        return max(0.0, self.charge_j - b.idle_w * max(0.0, now - self.at)) / b.capacity_j

    def device_state(self, now: float) -> DeviceState:
        """What the device reports at ``now`` (the charge to the percent: the same object's
        worth while it holds, so views are not rebuilt for every joule)."""
        battery = None if self.power.battery is None else int(self.charge_at(now) * 100) / 100
        t = self.power.thermal
        thermal = "nominal" if t is None else (
            "serious" if self.hot else "fair" if self.heat > t.cool_at else "nominal")
        return DeviceState(battery=battery, thermal=thermal)

    def advance(self, now: float, busy_s: float = 0.0) -> None:
        """Time passes to ``now``, of which the last ``busy_s`` computing."""
        idle_s = max(0.0, now - self.at - busy_s)
        if self.hot and not self.empty:  # a flat device is off, not throttled
            self.throttled_s += max(0.0, now - self.at)
        self.at = now
        self._drain(idle_s, busy_s, now)
        self._heat(idle_s + busy_s, busy_s)

    def _drain(self, idle_s: float, busy_s: float, now: float) -> None:
        b = self.power.battery
        if b is None or self.empty:
            return
        used = b.idle_w * (idle_s + busy_s) + b.active_w * busy_s
        self.energy_j += used
        self.charge_j -= used
        if self.empty:
            self.empty_at = now
            self.on_empty()

    def _heat(self, elapsed_s: float, busy_s: float) -> None:
        t = self.power.thermal
        if t is None:
            return
        self.heat = max(0.0, self.heat + busy_s - t.cool_per_s * elapsed_s)
        self.peak_heat = max(self.peak_heat, self.heat)
        if self.heat >= t.hot_at:
            self.hot = True
        elif self.heat <= t.cool_at:
            self.hot = False
