"""A scenario file: what a simulated run meets besides its fleet file.

::

    duration_s: 600                 # simulated seconds of arrivals
    arrivals: {kind: diurnal, rate_per_s: 40, amplitude: 0.6, period_s: 600,
               bursts: [{start_s: 100, end_s: 130, factor: 3}]}
    outages: {"edge-1->cloud-1": [[200, 260]]}   # the link carries nothing
    link_slow: {"dev-1->edge-1": [[100, 200, 8.0]]}  # its delay 8x longer
    crashes: {edge-2: [[300, 340]]}              # the process is down, then restarts
    slow: {edge-1: [[400, 500, 4.0]]}            # computes 4x slower
    jitter: 0.15                    # sigma of the log of a model's run time
    request_ms: 1.7                 # HTTP work of an app's request to its node and back
    hop_ms: [2.6, 2.8, 3.1, 5.0]    # ... of one forward upstream and back (both ends);
                                    # a list: measured values, one drawn per request
    power:                          # devices' batteries and heat (sim/power.py)
      devices: [dev-1, dev-2]       # default: every device
      battery: {capacity_j: 2000, idle_w: 0.3, active_w: 3.0, saver_below: 0.2,
                saver_speed: 0.5}
      thermal: {cool_per_s: 0.2, hot_at: 5.0, cool_at: 2.0, throttled_speed: 0.4}

Every key is optional; unknown keys are refused with the list of known ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tierlink.errors import ConfigError
from tierlink.sim.build import Scenario
from tierlink.sim.http import HttpCosts
from tierlink.sim.links import outage_windows
from tierlink.sim.power import Battery, DevicePower, Thermal
from tierlink.sim.workload import Arrivals, Burst

KEYS = ("duration_s", "arrivals", "outages", "link_slow", "crashes", "slow", "jitter",
        "heartbeat_s",
        "view_refresh_s", "ttl_s", "request_ms", "hop_ms", "compute_overhead_ms", "power")


@dataclass(frozen=True, slots=True)
class ScenarioFile:
    scenario: Scenario = field(default_factory=Scenario)
    arrivals: Arrivals | None = None
    duration_s: float | None = None
    # the file sets request_ms or hop_ms / compute_overhead_ms (else: the measured defaults)
    http_given: bool = False
    overhead_given: bool = False


def load_scenario(path: Path) -> ScenarioFile:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the scenario {path}: {exc}") from None
    return parse_scenario(raw, str(path))


def parse_scenario(raw: Any, where: str = "scenario") -> ScenarioFile:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping", hint=f"keys: {', '.join(KEYS)}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}", hint=f"known: {', '.join(KEYS)}")
    try:
        d = Scenario()
        scenario = Scenario(
            outages={str(k): outage_windows(v) for k, v in (raw.get("outages") or {}).items()},
            crashes={str(k): outage_windows(v) for k, v in (raw.get("crashes") or {}).items()},
            slow={str(k): tuple(_slow(w) for w in v) for k, v in (raw.get("slow") or {}).items()},
            link_slow={str(k): tuple(_slow(w) for w in v)
                       for k, v in (raw.get("link_slow") or {}).items()},
            jitter=float(raw.get("jitter", d.jitter)),
            heartbeat_s=float(raw.get("heartbeat_s", d.heartbeat_s)),
            view_refresh_s=float(raw.get("view_refresh_s", d.view_refresh_s)),
            ttl_s=float(raw.get("ttl_s", d.ttl_s)),
            http=HttpCosts.of(raw.get("request_ms", d.http.request_ms),
                              raw.get("hop_ms", d.http.hop_ms)),
            compute_overhead_ms=float(raw.get("compute_overhead_ms",
                                              d.compute_overhead_ms)),
            power=_power(raw["power"]) if raw.get("power") else None)
        arrivals = _arrivals(raw["arrivals"]) if "arrivals" in raw else None
        duration = float(raw["duration_s"]) if "duration_s" in raw else None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{where}: {exc}", hint="see `tierlink sim --help`") from None
    if duration is not None and duration <= 0:
        raise ConfigError(f"{where}: duration_s must be positive")
    if scenario.compute_overhead_ms < 0:
        raise ConfigError(f"{where}: compute_overhead_ms must be >= 0")
    return ScenarioFile(scenario, arrivals, duration,
                        http_given="request_ms" in raw or "hop_ms" in raw,
                        overhead_given="compute_overhead_ms" in raw)


def _slow(window: Any) -> tuple[float, float, float]:
    start, end, factor = (float(x) for x in window)
    if not 0 <= start < end or factor <= 0:
        raise ValueError(f"a slow window is [start_s, end_s, factor > 0], got {window}")
    return start, end, factor


def _power(raw: Mapping[str, Any]) -> DevicePower:
    unknown = sorted(set(raw) - {"devices", "battery", "thermal"})
    if unknown:
        raise ValueError(f"power: unknown key(s) {unknown} (known: devices, battery, thermal)")
    devices = raw.get("devices")
    return DevicePower(
        battery=Battery(**{k: float(v) for k, v in raw["battery"].items()})
        if raw.get("battery") else None,
        thermal=Thermal(**{k: float(v) for k, v in raw["thermal"].items()})
        if raw.get("thermal") else None,
        devices=None if devices is None else tuple(str(d) for d in devices))


def _arrivals(raw: Mapping[str, Any]) -> Arrivals:
    bursts = tuple(Burst(float(b["start_s"]), float(b["end_s"]), float(b["factor"]))
                   for b in raw.get("bursts", ()))
    extra = {k: float(raw[k]) for k in ("rate_per_s", "amplitude", "period_s") if k in raw}
    return Arrivals(kind=str(raw.get("kind", "poisson")), bursts=bursts, **extra)
