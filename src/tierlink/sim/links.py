"""Simulated links: what carrying a payload one way costs in simulated time.

Per direction: the payload waits for the bytes ahead of it (a bottleneck queue at the link's
bandwidth), then travels for half the RTT plus jitter. A lost packet costs a retransmission
timeout (max(200 ms, 2·RTT), as TCP pays it); an outage is a black hole: the payload waits
until the link is back (the sender's own timeout gives up first, as it would live); a
degraded window multiplies the propagation delay.
Randomness comes from the simulation's seeded generator. A payload's journey is a stage of
the operation that sent it (``sim/dispatch.Chain``): cancelled with it.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tierlink.sim.dispatch import Chain

MTU_BYTES = 1460
MIN_RTO_S = 0.2


@dataclass(frozen=True, slots=True)
class LinkShape:
    rtt_ms: float
    bandwidth_mbit: float | None = None  # None: not a bottleneck
    jitter_ms: float = 0.0
    loss: float = 0.0
    outages: tuple[tuple[float, float], ...] = ()  # (start_s, end_s) of simulated time
    # (start_s, end_s, factor): the link's delay is ``factor`` times longer (a degraded route)
    slow: tuple[tuple[float, float, float], ...] = ()


@dataclass
class _Direction:
    busy_until: float = 0.0


@dataclass
class SimLink:
    src: str
    dst: str
    shape: LinkShape
    rng: random.Random
    _up: _Direction = field(default_factory=_Direction)
    _down: _Direction = field(default_factory=_Direction)

    def send(self, nbytes: int, then: Callable[[], object], chain: Chain) -> None:
        """``src`` -> ``dst``; ``then`` once the payload is through."""
        self._carry(self._up, nbytes, 0.0, then, chain)

    def reply(self, nbytes: int, then: Callable[[], object], chain: Chain,
              after_s: float = 0.0) -> None:
        """``dst`` -> ``src``; ``after_s``: what the receiver does with it before it is
        through (its HTTP stack), in the same wait."""
        self._carry(self._down, nbytes, after_s, then, chain)

    def _carry(self, way: _Direction, nbytes: int, after_s: float, then: Callable[[], object],
               chain: Chain) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        back = self.back_at(now)
        if back is not None:  # the payload waits for the link, then travels
            chain.now = loop.call_at(back, self._carry, way, nbytes, after_s, then, chain)
            return
        chain.now = loop.call_later(max(0.0, self._delay(way, now, nbytes) + after_s), then)

    def back_at(self, now: float) -> float | None:
        """When an outage under way at ``now`` ends (None: the link is up)."""
        for start, end in self.shape.outages:
            if start <= now < end:
                return end
        return None

    def _delay(self, way: _Direction, now: float, nbytes: int) -> float:
        s = self.shape
        wire = 0.0
        if s.bandwidth_mbit:
            start = max(now, way.busy_until)
            way.busy_until = start + nbytes * 8.0 / (s.bandwidth_mbit * 1e6)
            wire = way.busy_until - now
        one_way = s.rtt_ms / 2000.0 * next((f for a, b, f in s.slow if a <= now < b), 1.0)
        if s.jitter_ms:
            one_way = max(0.0, one_way + self.rng.gauss(0.0, s.jitter_ms / 1000.0))
        if s.loss:
            packets = math.ceil(nbytes / MTU_BYTES) + 1
            if self.rng.random() > (1.0 - s.loss) ** packets:
                wire += max(MIN_RTO_S, 2.0 * s.rtt_ms / 1000.0)
        return wire + one_way


def outage_windows(raw: Sequence[Sequence[float]]) -> tuple[tuple[float, float], ...]:
    """``[[start_s, end_s], ...]`` checked and sorted."""
    out = []
    for pair in raw:
        start, end = float(pair[0]), float(pair[1])
        if not 0 <= start < end:
            raise ValueError(f"an outage runs from start to a later end, got {pair}")
        out.append((start, end))
    return tuple(sorted(out))
