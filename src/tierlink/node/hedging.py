"""Hedged requests ("The Tail at Scale"): when a call upstream is slower than usual, send a
second copy to another upstream and keep whichever answers first.

The **delay** is learned: per task, the node keeps the latencies of its recent successful
calls to each upstream; a hedge fires once a call has taken longer than the ``quantile``
(p95 by default) of calls to the task's *fastest* upstream — so a node that became slow does
not teach the hedger that slow is normal. With too few samples there is no hedge.

The **budget** bounds the extra load: every request deposits ``budget`` tokens, a hedge
spends one (so at most ``budget`` = 5% more upstream calls, plus a small burst). Hedging only
happens where the deadline leaves room for the hedge target's own estimate after the delay.
The dispatcher cancels the loser. Pure apart from its window of samples; no clock reads.
"""

from __future__ import annotations

import math
from collections import deque

from tierlink.settings.routing import HedgeConfig


class Hedger:
    """Latency windows, the hedge delay and the duplicate budget of one node."""

    def __init__(self, config: HedgeConfig) -> None:
        self.config = config
        self._samples: dict[tuple[str, str], deque[float]] = {}
        self._tokens = 1.0 if config.budget > 0 else 0.0
        self._cap = max(1.0, 20 * config.budget)

    def observe(self, task: str, node_id: str, ms: float) -> None:
        """A successful call to ``node_id`` for ``task`` took ``ms``."""
        key = (task, node_id)
        window = self._samples.get(key)
        if window is None:
            window = self._samples[key] = deque(maxlen=self.config.window)
        window.append(ms)

    def delay_ms(self, task: str) -> float | None:
        """How long to wait before hedging a call for ``task``; None: not enough data."""
        if not self.config.enabled:
            return None
        best = [quantile(list(w), self.config.quantile) for (t, _), w in self._samples.items()
                if t == task and len(w) >= self.config.min_samples]
        return max(self.config.min_delay_ms, min(best)) if best else None

    def deposit(self) -> None:
        """One request came in: it earns ``budget`` of a hedge."""
        self._tokens = min(self._cap, self._tokens + self.config.budget)

    def take(self) -> bool:
        """Spend one hedge if the budget allows it."""
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
