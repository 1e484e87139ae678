"""Keep a node's connections to its upstreams open, so an escalation never pays for one.

A cold connection over a long link costs a round trip or more before the request is even
sent, and when its hop's timeout cancels it halfway it is never pooled: the next escalation
starts cold again. On the demo's 80 ms edge->cloud link every early cascade escalation timed
out that way and the breakers then kept the cloud out of reach. So each node opens
``connections`` (2) connections to every upstream when it starts (retrying while the upstream
comes up) and to every upstream the registry gives it later within a quarter second, and
pings an upstream whose connections have been idle for ``idle_s`` (below the client's
keep-alive, 15 s) with ``GET /v2/health/ready``, that many at once.

Why two: HTTP/1.1 carries one request per connection at a time, and a forward that goes on
to the cloud holds its device->edge connection for a whole cloud round trip (~80 ms on the
demo's links), so a device's next forward often overlaps it. With one warm connection the
first overlap on each link paid a handshake (on the demo fleet: 8 per launch, one per
device->edge link, most of them in the first seconds of traffic). The client reuses its
pooled connections in turn (first released, first reused), so traffic keeps both warm.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 5.0  # aiohttp closes a pooled connection idle for 15 s; uvicorn's is 30 s
NEW_EVERY_S = 0.25  # how often to look for upstreams the registry just gave the node
DEFAULT_CONNECTIONS = 2  # warm connections per upstream (the module's docstring says why)


class Target(Protocol):
    """An upstream as the keep-warm loop sees it: which node, its URL and when it was last
    used."""

    @property
    def node_id(self) -> str: ...

    @property
    def url(self) -> str: ...

    last_used: float


class ReadyClient(Protocol):
    async def ready(self, base_url: str, timeout_s: float | None = None, *,
                    peer: str | None = None) -> bool: ...


class KeepWarm:
    """Opens and keeps open ``connections`` connections per upstream. ``clock``: monotonic
    seconds."""

    def __init__(self, client: ReadyClient, targets: Callable[[], Iterable[Target]],
                 clock: Callable[[], float], idle_s: float = DEFAULT_IDLE_S,
                 timeout_s: float = 5.0, connections: int = DEFAULT_CONNECTIONS) -> None:
        if connections < 1:
            raise ValueError(f"KeepWarm keeps at least one connection warm, got {connections}")
        self._client, self._targets, self._clock = client, targets, clock
        self._idle_s, self._timeout_s = idle_s, timeout_s
        self._connections = connections

    async def run(self) -> None:
        await self.open_all()
        next_idle = self._clock() + self._idle_s / 2
        while True:
            await asyncio.sleep(min(NEW_EVERY_S, self._idle_s / 2))
            await self.open_new()
            if self._clock() >= next_idle:
                await self.ping_idle()
                next_idle = self._clock() + self._idle_s / 2

    async def open_new(self) -> None:
        """A connection to each upstream that never had one (the registry just made it an
        upstream: node/topology.py), so its first escalation does not pay for one."""
        new = [t for t in self._targets() if t.last_used == float("-inf")]
        await asyncio.gather(*(self._ping(t) for t in new))

    async def open_all(self, attempts: int = 10, pause_s: float = 0.5) -> None:
        """``connections`` to every upstream; an upstream still starting is retried a few
        times, then left to the idle pings."""
        pending = list(self._targets())
        for _ in range(attempts):
            results = await asyncio.gather(*(self._ping(t) for t in pending))
            pending = [t for t, ok in zip(pending, results, strict=True) if not ok]
            if not pending:
                return
            await asyncio.sleep(pause_s)
        log.info("upstreams not ready yet: %s", ", ".join(t.url for t in pending))

    async def ping_idle(self) -> None:
        now = self._clock()
        idle = [t for t in self._targets() if now - t.last_used >= self._idle_s]
        await asyncio.gather(*(self._ping(t) for t in idle))

    async def _ping(self, target: Target) -> bool:
        """``connections`` checks sent together, so the client opens (or uses) that many
        connections: requests in flight at once cannot share one."""
        ok = all(await asyncio.gather(*(self._client.ready(target.url, timeout_s=self._timeout_s,
                                                           peer=target.node_id)
                                        for _ in range(self._connections))))
        if ok:
            target.last_used = self._clock()
        return ok
