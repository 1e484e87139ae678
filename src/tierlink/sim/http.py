"""What the HTTP stacks cost beyond the wire and the model: an application's request to its
device node and back (``request``), and one forward to an upstream and back (``hop``: the
caller's and the callee's work, and the link emulator's relays on a fleet of one machine).

Each cost is a set of measured values (ms), one drawn at random for each request or hop,
so a simulated fleet has the spread of the real one, not only its median. One value is a
constant. :func:`costs_from_log` measures both from a live run's request log
(``tierlink demo --log``): ``request`` from the requests a device answered itself (the
application's latency minus the model's compute), ``hop`` from those one upstream answered
(the latency minus the link's round trip and transfer, the upstream's own time and the
median request cost).

With no log, ``tierlink sim`` uses :func:`measured_defaults`: the costs measured on live
runs of the demo's fleet on a two-core machine (``serving_defaults.json``, written by
``benchmarks/sim_calibration.py --write-defaults`` with its date and runs), so a simulated
fleet answers in the time a real one would, not in the model's compute alone — and with
them what a model run costs beyond its card (``compute_overhead_ms``: the node's own work
around the runtime's, measured on the devices' answers as their compute time less the
card's latency at their speed).
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tierlink.errors import ConfigError
from tierlink.fleet.config import FleetConfig
from tierlink.fleet.requestlog import LoggedRequest

__all__ = ["HttpCosts", "MeasuredDefaults", "costs_by_run", "costs_from_log",
           "measured_defaults", "write_defaults"]
DEFAULTS_FILE = "serving_defaults.json"
QUANTILES = 100  # values kept of each measured distribution

MIN_SAMPLES = 20  # fewer measured requests than this say too little about a spread


@dataclass(frozen=True, slots=True)
class HttpCosts:
    request_ms: tuple[float, ...] = (0.0,)
    hop_ms: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        for name, values in (("request_ms", self.request_ms), ("hop_ms", self.hop_ms)):
            if not values or any(not v >= 0 for v in values):
                raise ConfigError(f"{name} takes one or more costs >= 0 (ms), got {values}")

    @classmethod
    def of(cls, request_ms: float | Sequence[float], hop_ms: float | Sequence[float]
           ) -> HttpCosts:
        return cls(_values(request_ms), _values(hop_ms))

    @property
    def free(self) -> bool:
        return self.request_ms == (0.0,) and self.hop_ms == (0.0,)

    def request_s(self, rng: random.Random) -> float:
        return _draw(self.request_ms, rng) / 1000.0

    def hop_s(self, rng: random.Random) -> float:
        return _draw(self.hop_ms, rng) / 1000.0

    def summary(self) -> dict[str, dict[str, float]]:
        return {name: _quantiles(values) for name, values
                in (("request_ms", self.request_ms), ("hop_ms", self.hop_ms))}


@dataclass(frozen=True, slots=True)
class MeasuredDefaults:
    """The costs live runs of the demo's fleet paid: all runs together, each demo run's
    own (a request's cost includes its node's planning, which differs by policy), and where
    and when they were measured."""

    pooled: HttpCosts
    by_run: Mapping[str, HttpCosts]
    compute_overhead_ms: float
    provenance: Mapping[str, Any]


def measured_defaults() -> MeasuredDefaults:
    """The packaged defaults (see the module)."""
    text = resources.files("tierlink.sim").joinpath(DEFAULTS_FILE).read_text()
    data = json.loads(text)

    def costs(raw: Mapping[str, Any]) -> HttpCosts:
        return HttpCosts.of(raw["request_ms"], raw["hop_ms"])

    return MeasuredDefaults(costs(data["pooled"]),
                            {name: costs(c) for name, c in data["by_run"].items()},
                            float(data.get("compute_overhead_ms", 0.0)), data["provenance"])


def write_defaults(path: Path, pooled: HttpCosts, by_run: Mapping[str, HttpCosts],
                   provenance: Mapping[str, Any], compute_overhead_ms: float = 0.0) -> None:
    """Store measured costs as the defaults (:data:`QUANTILES` values of each)."""
    def costs(c: HttpCosts) -> dict[str, list[float]]:
        return {"request_ms": _spread(c.request_ms), "hop_ms": _spread(c.hop_ms)}

    lines = [f'"provenance": {json.dumps(dict(provenance))}',
             f'"compute_overhead_ms": {round(compute_overhead_ms, 4)}',
             f'"pooled": {json.dumps(costs(pooled))}',
             '"by_run": {' + ",\n  ".join(f"{json.dumps(n)}: {json.dumps(costs(c))}"
                                          for n, c in by_run.items()) + "}"]
    path.write_text("{\n " + ",\n ".join(lines) + "\n}\n")  # a line per distribution set


def _spread(values: Sequence[float]) -> list[float]:
    """Evenly spaced quantiles of ``values``: their spread in a fixed number of values."""
    ordered = sorted(values)
    if len(ordered) <= QUANTILES:
        return [round(v, 3) for v in ordered]
    return [round(ordered[int((i + 0.5) * len(ordered) / QUANTILES)], 3)
            for i in range(QUANTILES)]


def costs_from_log(entries: Sequence[LoggedRequest], config: FleetConfig,
                   input_bytes: int) -> HttpCosts:
    """Both costs as a live run of ``config`` paid them (see the module's docstring)."""
    local = _request_samples(entries)
    if len(local) < MIN_SAMPLES:
        raise ConfigError(f"the log holds {len(local)} requests a device answered itself; "
                          f"measuring the request cost needs {MIN_SAMPLES}",
                          hint="log a run where devices answer (e.g. the demo's tierlink run)")
    hops = _hop_samples(entries, statistics.median(local), config, input_bytes)
    if len(hops) < MIN_SAMPLES:
        raise ConfigError(f"the log holds {len(hops)} requests answered one hop up; "
                          f"measuring the hop cost needs {MIN_SAMPLES}",
                          hint="log runs that forward (e.g. the demo's static_rules run)")
    return HttpCosts(local, hops)


def costs_by_run(runs: Mapping[str, Sequence[LoggedRequest]], config: FleetConfig,
                 input_bytes: int) -> tuple[HttpCosts, dict[str, HttpCosts]]:
    """The costs of all the log's runs together, and of each run on its own: a request's
    cost includes its node's planning, which differs by policy. A run with too few
    measurements of a cost takes the pooled one."""
    pooled = costs_from_log([e for run in runs.values() for e in run], config, input_bytes)
    own: dict[str, HttpCosts] = {}
    for name, entries in runs.items():
        local = _request_samples(entries)
        request = local if len(local) >= MIN_SAMPLES else pooled.request_ms
        hops = _hop_samples(entries, statistics.median(request), config, input_bytes)
        own[name] = HttpCosts(request, hops if len(hops) >= MIN_SAMPLES else pooled.hop_ms)
    return pooled, own


def _request_samples(entries: Sequence[LoggedRequest]) -> tuple[float, ...]:
    """Requests a device answered itself: the application's latency minus the compute."""
    return tuple(round(e.latency_ms - e.timings["compute_ms"], 3) for e in entries
                 if e.answered and e.served_by == e.item.origin and "compute_ms" in e.timings)


def _hop_samples(entries: Sequence[LoggedRequest], request_ms: float, config: FleetConfig,
                 input_bytes: int) -> tuple[float, ...]:
    """Requests one upstream answered: the latency minus the request's cost, the link's
    round trip and transfer both ways, and the upstream's own time."""
    links = {(link.src, link.dst): link for link in config.links}
    hops = []
    for e in entries:
        link = links.get((e.item.origin, e.served_by))
        if e.answered and link is not None and "server_ms" in e.timings:
            wire = link.rtt_ms + 2 * _transfer_ms(input_bytes, link.bandwidth_mbit)
            hops.append(round(max(0.0, e.latency_ms - request_ms - wire
                                  - e.timings["server_ms"]), 3))
    return tuple(hops)


def _transfer_ms(nbytes: int, mbit: float | None) -> float:
    return 0.0 if not mbit else nbytes * 8 / (mbit * 1000.0)


def _values(raw: float | Sequence[float]) -> tuple[float, ...]:
    if isinstance(raw, (int, float)):
        return (float(raw),)
    return tuple(float(v) for v in raw)


def _draw(values: tuple[float, ...], rng: random.Random) -> float:
    return values[0] if len(values) == 1 else values[rng.randrange(len(values))]


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"n": len(ordered), "p50": at(0.5), "p95": at(0.95), "p99": at(0.99)}

