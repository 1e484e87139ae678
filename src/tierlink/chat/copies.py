"""Copies of conversations kept at the node their turns enter through, so that a
conversation outlives the upstream holding its KV cache (fleet file: a node's
``chat: {kv_copies: true}``).

After each turn an upstream answered for this node, the copy is brought up to date in the
background — never on the answer's path: this node asks the upstream for the slots the copy
lacks (``GET /tierlink/v1/llm/{model}/kv?session=…&since=…&evicted=…&for=…``, a *delta*
package, ``llm/kvship.py``; the whole cache when it evicted since) and appends it. When the
next turn is placed on another upstream and the holder cannot ship the cache itself — it
failed, it left this node's upstreams — this node ships its copy there: the chain of
packages, loaded as one cache. A copy that lags the last turn (its delta still on the way)
still covers most of the history: the receiver prefills only what it lacks.

Only the conversation's origin is given copies (the holder checks ``for`` against the
session's origin): the node the conversation came from may always hold it, so a copy never
goes where privacy would not let the conversation go. The copies are held in memory, the
least recently refreshed dropped past ``max_bytes``; a copy is shipped where the receiver's
model computes the same caches (equal identity) and privacy lets it hold the conversation,
and — where this node has an estimate of the link — when moving is expected to beat
prefilling there.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tierlink.llm.kvship import Holder, holder_of, read_header
from tierlink.routing.privacy import may_hold
from tierlink.security.names import expect_node

if TYPE_CHECKING:
    import aiohttp

    from tierlink.chat.handover import Destination
    from tierlink.telemetry.llm_metrics import LLMMetrics

log = logging.getLogger("tierlink.chat")

DEFAULT_MAX_BYTES = 256 << 20  # of packages held by one node
COPY_TIMEOUT_S = 60.0
BUSY_WAITS_S = (0.05, 0.2, 1.0)  # between asking again a holder whose session is busy


@dataclass(slots=True)
class Copy:
    """One conversation's copy: the packages of a chain, and where they came from."""

    holder: str  # the node whose cache it copies
    model: str  # that node's model name
    packages: list[bytes] = field(default_factory=list)
    # the last package's header: the copy's identity, slots, tokens, privacy
    header: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0

    def chain(self) -> bytes:
        return b"".join(self.packages)

    def add(self, blob: bytes) -> None:
        """A package taken from the holder: a delta extends the chain, a whole one
        replaces it."""
        header = read_header(blob)
        if header.get("start", 0) == 0:
            self.packages, self.nbytes = [blob], len(blob)
        elif self.packages and header["start"] == self.header["length"]:
            self.packages.append(blob)
            self.nbytes += len(blob)
        else:
            raise ValueError("a delta that does not continue the copy")
        self.header = header


class KeptCopies:
    """This node's copies of the conversations it relays (see the module doc)."""

    def __init__(self, node_id: str, http: Callable[[], aiohttp.ClientSession],
                 tls: Callable[[], ssl.SSLContext | None],
                 upstreams: Callable[[], Mapping[str, str]],
                 metrics: LLMMetrics | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.node_id = node_id
        self._http = http
        self._tls = tls
        self._upstreams = upstreams
        self._metrics = metrics
        self.max_bytes = max_bytes
        self._copies: OrderedDict[str, Copy] = OrderedDict()
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    def get(self, session: str) -> Copy | None:
        return self._copies.get(session)

    def __len__(self) -> int:
        return len(self._copies)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._copies.values())

    def after_turn(self, session: str, holder: str, model: str) -> None:
        """``holder``'s ``model`` answered a turn of ``session``: bring the copy up to date
        in the background (after the refresh in flight, if one is)."""
        before = self._refreshing.get(session)
        task = asyncio.ensure_future(self._refresh(session, holder, model, before))
        self._refreshing[session] = task
        task.add_done_callback(lambda t: self._settled(session, t))

    def _settled(self, session: str, task: asyncio.Task[None]) -> None:
        if self._refreshing.get(session) is task:
            del self._refreshing[session]

    async def settled(self) -> None:
        """Wait for the refreshes in flight (tests, shutdown)."""
        await asyncio.gather(*self._refreshing.values(), return_exceptions=True)

    async def stop(self) -> None:
        for task in list(self._refreshing.values()):
            task.cancel()
        await self.settled()

    async def _refresh(self, session: str, holder: str, model: str,
                       before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        import aiohttp

        from tierlink.errors import TierlinkError

        copy = self._copies.get(session)
        if copy is None or (copy.holder, copy.model) != (holder, model):
            copy = Copy(holder, model)
        try:
            blob = await self._fetch_when_free(session, copy)
            copy.add(blob)
        except (TierlinkError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            # a background refresh: the copy stays as it was
            self._count(model, "failed", 0)
            log.info("copy of conversation %s from %s not refreshed: %s", session, holder,
                     exc)
            return
        self._copies[session] = copy
        self._copies.move_to_end(session)
        self._count(model, "kept", len(blob))
        held = self.nbytes
        while held > self.max_bytes and len(self._copies) > 1:
            held -= self._copies.popitem(last=False)[1].nbytes

    async def _fetch_when_free(self, session: str, copy: Copy) -> bytes:
        """:meth:`_fetch`, again a little later while the holder is still finishing the
        turn (the answer's last chunk can arrive before its session is let go)."""
        from tierlink.errors import SessionBusy

        for wait_s in BUSY_WAITS_S:
            try:
                return await self._fetch(session, copy)
            except SessionBusy:
                await asyncio.sleep(wait_s)
        return await self._fetch(session, copy)

    async def _fetch(self, session: str, copy: Copy) -> bytes:
        import aiohttp

        from tierlink.chat.handover import kv_path, raise_unless_ok
        from tierlink.errors import UpstreamUnavailable

        url = self._upstreams().get(copy.holder)
        if url is None:
            raise UpstreamUnavailable(f"{copy.holder} is no longer an upstream")
        since = (copy.header["length"], copy.header["evicted"]) if copy.packages else (0, 0)
        params = {"session": session, "since": str(since[0]), "evicted": str(since[1]),
                  "for": self.node_id}
        async with self._http().get(
                url.rstrip("/") + kv_path(copy.model), params=params,
                timeout=aiohttp.ClientTimeout(total=COPY_TIMEOUT_S),
                server_hostname=expect_node(copy.holder, self._tls())) as r:
            await raise_unless_ok(r)
            return await r.read()

    async def ship(self, session: str, to: Destination, timeout_s: float
                   ) -> dict[str, Any] | None:
        """Ship ``session``'s copy to ``to`` if it may and should go there; what happened
        (None: no copy of it here)."""
        from tierlink.chat.handover import put_package
        from tierlink.errors import TierlinkError

        copy = self._copies.get(session)
        if copy is None:
            return None
        header = copy.header
        holder = holder_of(header)
        why = _why_not(header, holder, copy.nbytes, to)
        if why is not None:
            return {"moved": False, "from": self.node_id, "copy": True, "reason": why}
        blob = copy.chain()
        start = time.perf_counter()
        try:
            await put_package(self._http(), to, session, blob, timeout_s)
        except TierlinkError as exc:
            return {"moved": False, "from": self.node_id, "copy": True, "reason": exc.code,
                    "detail": exc.message}
        self._count(copy.model, "shipped", len(blob))
        return {"moved": True, "from": self.node_id, "copy": True, "codec": header["codec"],
                "bytes": len(blob), "tokens": len(holder.tokens),
                "ms": round((time.perf_counter() - start) * 1e3, 1)}

    def _count(self, model: str, outcome: str, nbytes: int) -> None:
        if self._metrics is not None:
            m = self._metrics
            m.kv_moves.labels(m.tier, model, "copy", outcome).inc()
            m.kv_move_bytes.labels(m.tier, model, "copy").inc(nbytes)



def _why_not(header: dict[str, Any], holder: Holder, nbytes: int, to: Destination
             ) -> str | None:
    """Why a copy of ``nbytes`` (its last package's ``header``) may not or should not go to
    ``to``; None: it goes."""
    if not to.model.identity or to.model.identity != header.get("model"):
        return "not the same model file there"
    if not may_hold(holder.privacy, to.tier, to.node_id, holder.origin):
        return f"a {holder.privacy.value} conversation's cache stays off {to.tier.label}"
    if to.link is not None and to.model.prefill_tok_s > 0:
        move_s = 2 * to.link.rtt_ms / 1e3 + nbytes * 8 / (to.link.bandwidth_mbit * 1e6)
        if move_s >= len(holder.tokens) / to.model.prefill_tok_s:
            return "prefilling there is expected to be faster"
    return None
