"""The language models of a node's upstreams, as each lists them (``GET /v1/models``).

Chat placement needs them fresh (each model's running and queued sequences) and needs them
with or without a control plane, so a node asks its upstreams directly: at most every
``refresh_s``, in the background once it has an answer to go on, and only while chat
requests come (a node nobody asks for chat never polls). An upstream that does not answer
is left out until it does. The upstreams are read afresh each time (a node's upstreams
follow the registry: node/topology.py), and one that is no longer among them is forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierlink.core.types import LanguageModelView, NodeView, Tier

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PeerEntry:
    tier: Tier
    models: tuple[LanguageModelView, ...]
    fetched_at: float


def parse_models(listing: Mapping[str, Any]) -> tuple[Tier, tuple[LanguageModelView, ...]]:
    """A node's tier and language models from its ``GET /v1/models`` answer."""
    tier = Tier.parse(str(listing.get("tierlink", {}).get("tier", "cloud")))
    views = []
    for entry in listing.get("data", ()):
        meta = entry.get("tierlink") or {}
        if meta.get("kind") == "model" and isinstance(meta.get("view"), dict):
            views.append(LanguageModelView.from_dict(meta["view"]))
    return tier, tuple(views)


class PeerModels:
    def __init__(self, upstreams: Callable[[], Mapping[str, str]],
                 http: Callable[[], aiohttp.ClientSession], refresh_s: float = 2.0,
                 timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 peer: Callable[[str], str | None] = lambda _node: None) -> None:
        self._upstreams = upstreams  # now: node id -> base URL
        self._http = http
        self._peer = peer  # node id -> the name TLS checks it by (None: its URL's host)
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._clock = clock
        self.known: dict[str, PeerEntry] = {}
        self._asked_at = float("-inf")
        self._task: asyncio.Task[None] | None = None

    async def current(self) -> list[NodeView]:
        """The upstreams' views now: waits for the first answers, refreshes stale ones in
        the background after that."""
        now = self._clock()
        if self._upstreams() and now - self._asked_at >= self.refresh_s and (
                self._task is None or self._task.done()):
            first = self._task is None
            self._asked_at = now
            self._task = asyncio.ensure_future(self.refresh())
            if first:  # later refreshes never hold a request up
                await asyncio.shield(self._task)
        return self.views()

    def views(self) -> list[NodeView]:
        now, upstreams = self._clock(), self._upstreams()
        return [NodeView(node_id, e.tier, (), language_models=e.models,
                         age_s=max(now - e.fetched_at, 0.0))
                for node_id, e in self.known.items()
                if node_id in upstreams and now - e.fetched_at <= max(5 * self.refresh_s, 10.0)]

    async def refresh(self) -> None:
        upstreams = dict(self._upstreams())
        for gone in self.known.keys() - upstreams.keys():
            del self.known[gone]
        await asyncio.gather(*(self._fetch(n, u) for n, u in upstreams.items()))

    async def _fetch(self, node_id: str, url: str) -> None:
        import aiohttp

        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self._http().get(url.rstrip("/") + "/v1/models", timeout=timeout,
                                        server_hostname=self._peer(node_id)) as r:
                if r.status != 200:
                    return
                tier, models = parse_models(await r.json())
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            log.debug("upstream %s did not list its language models: %s", node_id, exc)
            return
        self.known[node_id] = PeerEntry(tier, models, self._clock())

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
