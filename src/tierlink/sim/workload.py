"""When requests arrive in a simulation: a steady rate (the demo's), a Poisson process, a
diurnal cycle, bursts — each a rate over simulated time, sampled by thinning (Lewis and
Shedler) with the run's seeded generator. What each request is (its SLA class, privacy
level, device and input) is drawn as the demo draws it (``fleet/workload.make_items``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tierlink.errors import ConfigError
from tierlink.fleet.workload import WorkItem, make_items

KINDS = ("constant", "poisson", "diurnal")


@dataclass(frozen=True, slots=True)
class Burst:
    start_s: float
    end_s: float
    factor: float  # the rate is multiplied by this while the burst lasts


@dataclass(frozen=True, slots=True)
class Arrivals:
    kind: str = "constant"
    rate_per_s: float = 25.0  # mean rate (diurnal: the day's mean)
    amplitude: float = 0.6  # diurnal: the rate swings ± this share around the mean
    period_s: float = 86_400.0  # diurnal: one day; the peak is at half the period
    bursts: tuple[Burst, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"arrivals must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.rate_per_s > 0:
            raise ConfigError("the arrival rate must be positive")
        if not 0 <= self.amplitude < 1:
            raise ConfigError("a diurnal amplitude is a share in [0, 1)")

    def rate(self, t: float) -> float:
        r = self.rate_per_s
        if self.kind == "diurnal":
            r *= 1.0 - self.amplitude * math.cos(2.0 * math.pi * t / self.period_s)
        for b in self.bursts:
            if b.start_s <= t < b.end_s:
                r *= b.factor
        return r

    def peak(self) -> float:
        top = self.rate_per_s * (1.0 + (self.amplitude if self.kind == "diurnal" else 0.0))
        return top * max([1.0, *(b.factor for b in self.bursts)])


def arrival_times(arrivals: Arrivals, duration_s: float, rng: random.Random,
                  limit: int | None = None) -> list[float]:
    """Arrival times in [0, ``duration_s``), at most ``limit`` of them (a constant rate
    with bursts arrives as a Poisson process of that rate)."""
    if arrivals.kind == "constant" and not arrivals.bursts:
        n = int(duration_s * arrivals.rate_per_s)
        return [i / arrivals.rate_per_s for i in range(n if limit is None else min(n, limit))]
    top = arrivals.peak()
    times: list[float] = []
    t = 0.0
    while limit is None or len(times) < limit:
        t += rng.expovariate(top)
        if t >= duration_s:
            break
        if rng.random() * top <= arrivals.rate(t):
            times.append(t)
    return times


def workload(arrivals: Arrivals, duration_s: float, devices: Sequence[str], n_samples: int,
             seed: int, limit: int | None = None) -> list[WorkItem]:
    times = arrival_times(arrivals, duration_s, random.Random(f"{seed}:arrivals"), limit)
    return make_items(times, devices, n_samples, seed)
