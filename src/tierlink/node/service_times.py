"""How long a node's jobs take to run, learned as they finish: an exponentially weighted
moving average per key (a model, a split's head) and one over every job — the scheduler's
estimates for admission, a node's view of itself and the placement that reads it."""

from __future__ import annotations

import math

from tierlink.errors import ConfigError

__all__ = ["ServiceTimes"]


class ServiceTimes:
    """``initial_ms``: the estimate before anything was measured; ``alpha``: the weight of
    each new measurement. ``learned`` grows at each time learned or seeded (views that
    follow the estimates rebuild when it moves)."""

    def __init__(self, initial_ms: float, alpha: float) -> None:
        self.overall_ms = initial_ms
        self.by_key: dict[str, float] = {}
        self.learned = 0
        self._alpha = alpha

    def estimate_ms(self, key: str = "") -> float:
        """Expected run time of one job of ``key`` (its EWMA, else the one over all)."""
        return self.by_key.get(key, self.overall_ms)

    def seed(self, key: str, service_ms: float) -> None:
        """Set the prior run time of ``key`` (e.g. a model card's latency) before it is
        measured; later measurements are blended into it."""
        if not (service_ms >= 0 and math.isfinite(service_ms)):
            raise ConfigError(f"service time of {key!r} must be finite and >= 0, got {service_ms}")
        self.by_key[key] = service_ms
        self.learned += 1

    def learn(self, key: str, run_ms: float) -> None:
        """One job of ``key`` ran for ``run_ms``."""
        alpha = self._alpha
        self.learned += 1
        self.overall_ms += alpha * (run_ms - self.overall_ms)
        if key:
            prev = self.by_key.get(key)
            # The first measurement of an unseeded key replaces the global fallback outright.
            self.by_key[key] = run_ms if prev is None else prev + alpha * (run_ms - prev)
