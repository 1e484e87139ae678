"""Conversations that move between nodes: a session's KV cache shipped to the node that
answers its next turn, so that node does not prefill the history again.

The node a conversation's turns enter through places each turn (``policy/chat.py``); when it
relays one to an upstream, the cache goes ahead of it (``PUT /tierlink/v1/llm/{model}/kv``
with a package, ``llm/kvship.py``) from wherever it is:

* from here, when this node answered the conversation's earlier turns itself;
* from the upstream that answered the last turn, when the policy now places the turn on
  another one (that node drains, the turn's privacy keeps it off that tier, another is
  better now): that upstream is asked to ship it (``POST /tierlink/v1/llm/kv/ship``,
  ``chat/kv_routes.py``) and answers what it did.

Either sender ships only when

* the destination's model computes the same caches (equal ``identity``: the same weights
  file, precision and kernels);
* privacy lets the destination hold what the conversation's turns carried (the strictest
  of them: a ``local`` conversation's cache never leaves its device), checked by the sender
  and again on arrival;
* moving is expected to beat prefilling there (``kv_move: auto``): the package's bytes over
  the sender's estimate of its link plus a round trip, against the history's tokens at the
  destination's prefill rate (no estimate of the link: it does not ship). ``always`` ships
  whatever the estimate, ``never`` does not.

A shipment that fails leaves the destination to prefill; the answer says which happened in
its ``tierlink.kv`` (``moved``, ``codec``, ``bytes``, ``ms``, ``from``, or ``reason``).

A node that fails takes its caches with it — unless the node the turns enter through keeps
copies (``chat/copies.py``): when the holder cannot ship (it is gone, unreachable, no longer
an upstream), the copy goes instead (``"copy": true``).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierlink.chat.copies import KeptCopies
from tierlink.core.types import LanguageModelView, LinkView, Tier
from tierlink.errors import InvalidRequest, TierlinkError
from tierlink.llm.kvship import package_bytes
from tierlink.routing.privacy import may_hold
from tierlink.security.names import expect_node

if TYPE_CHECKING:
    import aiohttp

    from tierlink.chat.affinity import SessionAffinity
    from tierlink.chat.openai import ChatRequest
    from tierlink.chat.service import Prepared
    from tierlink.llm.face import ServedModel
    from tierlink.policy.chat import ChatOption
    from tierlink.telemetry.llm_metrics import LLMMetrics


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a turn is relayed: the node, its model as the view lists it, its base URL,
    and this node's link to it (None: not estimated)."""

    node_id: str
    tier: Tier
    model: LanguageModelView
    url: str
    link: LinkView | None
    server_hostname: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """What a holder is told of where to ship (:meth:`from_dict` reads it back, with
        the holder's own link estimate and TLS name)."""
        return {"node_id": self.node_id, "tier": self.tier.label, "url": self.url,
                "model": self.model.to_dict()}

    @classmethod
    def from_dict(cls, raw: Any, links: Iterable[LinkView],
                  server_hostname: Callable[[str], str | None]) -> Destination:
        try:
            node_id, url = str(raw["node_id"]), str(raw["url"])
            tier = Tier.parse(raw["tier"])
            model = LanguageModelView.from_dict(raw["model"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"to must be {{node_id, tier, url, model}}: {exc}",
                                 param="to") from None
        if not url.startswith(("http://", "https://")):
            raise InvalidRequest("to.url must be an http(s) URL", param="to")
        return cls(node_id, tier, model, url, links_to(links, node_id),
                   server_hostname(node_id))


SHIP_PATH = "/tierlink/v1/llm/kv/ship"
# What a holder that cannot ship answers (or is said of it): a kept copy goes instead
HOLDER_GONE = ("holder_unreachable", "holder_unreadable", "no_upstream", "upstream_unavailable",
               "upstream_timeout", "no longer held here")


def kv_path(model: str) -> str:
    return f"/tierlink/v1/llm/{model}/kv"


def worth_moving(lm: ServedModel, tokens: int, slots: int, to: Destination) -> bool:
    """Whether shipping the cache is expected to beat the destination prefilling it."""
    if to.link is None or to.model.prefill_tok_s <= 0:
        return False
    size = package_bytes(lm.config, slots, lm.source.kv_codec)
    move_s = 2 * to.link.rtt_ms / 1e3 + size * 8 / (to.link.bandwidth_mbit * 1e6)
    return move_s < tokens / to.model.prefill_tok_s


class Handover:
    """The sending end: this node's conversations shipped ahead of the turns it relays,
    and the upstream holding one asked to ship it where the next turn goes."""

    def __init__(self, node_id: str, http: Callable[[], aiohttp.ClientSession],
                 tls: Callable[[], ssl.SSLContext | None],
                 links: Callable[[], Iterable[LinkView]],
                 upstreams: Callable[[], Mapping[str, str]], affinity: SessionAffinity,
                 metrics: LLMMetrics | None = None, keep_copies: bool = False) -> None:
        self.node_id = node_id
        self._http = http
        self._tls = tls
        self.links = links
        self._upstreams = upstreams
        self._affinity = affinity
        self._metrics = metrics
        # copies of the conversations this node relays (chat/copies.py), when it keeps them
        self.copies = KeptCopies(node_id, http, tls, upstreams, metrics) \
            if keep_copies else None

    async def before_relay(self, req: ChatRequest, prep: Prepared, option: ChatOption,
                           url: str) -> dict[str, Any] | None:
        """Ship the cache of ``req``'s conversation to ``option``'s node when it should go
        (module docstring): from here when this node holds it, else from the upstream that
        answered its last turn; what happened, for the answer's ``tierlink.kv`` (None:
        nothing of it is held here or upstream)."""
        lm, session = prep.lm, req.tierlink.session
        if session is None:
            return None
        held = lm.held(session) if lm is not None else None
        timeout_s = req.tierlink.deadline_ms / 1e3
        if lm is not None and held is not None and not held.busy and held.tokens:
            outcome = await move(self._http(), lm, session,
                                 self._destination(prep, option, url), timeout_s)
            self.count(lm.name, outcome)
            return outcome
        holder = self._affinity.node_of(session)
        if holder is None or holder in (self.node_id, option.node_id):
            return None
        to = self._destination(prep, option, url)
        outcome = await self._from(holder, session, to, timeout_s)
        if outcome.get("moved") or outcome.get("reason") not in HOLDER_GONE \
                or self.copies is None:
            return outcome
        shipped = await self.copies.ship(session, to, timeout_s)
        return outcome if shipped is None else {**shipped, "holder": outcome}

    async def _from(self, holder: str, session: str, to: Destination,
                    timeout_s: float) -> dict[str, Any]:
        """Ask ``holder`` (the upstream that answered the conversation's last turn) to ship
        its cache to ``to``; its answer, or why it could not be asked."""
        import aiohttp

        url = self._upstreams().get(holder)
        if url is None:
            return {"moved": False, "from": holder, "reason": "no_upstream",
                    "detail": f"{holder} is no longer an upstream of {self.node_id}"}
        try:
            async with self._http().post(
                    url.rstrip("/") + SHIP_PATH, json={"session": session, "to": to.to_dict()},
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                    server_hostname=expect_node(holder, self._tls())) as r:
                body = await r.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            return {"moved": False, "from": holder, "reason": "holder_unreachable",
                    "detail": str(exc) or type(exc).__name__}
        if not isinstance(body, dict):
            return {"moved": False, "from": holder, "reason": "holder_unreadable"}
        if r.status != 200:
            return {"moved": False, "from": holder, "reason": str(body.get("code", r.status)),
                    "detail": str(body.get("error", ""))}
        return {**body, "from": holder}

    def count(self, model: str, outcome: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.kv_moves.labels(self._metrics.tier, model, "out",
                                          "moved" if outcome["moved"] else "kept").inc()
            self._metrics.kv_move_bytes.labels(self._metrics.tier, model, "out").inc(
                outcome.get("bytes", 0))

    def _destination(self, prep: Prepared, option: ChatOption, url: str) -> Destination:
        node = prep.view.nodes.get(option.node_id) if prep.view is not None else None
        model = next((m for m in node.language_models if m.name == option.model), None) \
            if node is not None else None
        return Destination(option.node_id, node.tier if node is not None else Tier.CLOUD,
                           model or LanguageModelView(option.model), url,
                           links_to(self.links(), option.node_id),
                           expect_node(option.node_id, self._tls()))


async def move(http: aiohttp.ClientSession, lm: ServedModel, session: str, to: Destination,
               timeout_s: float) -> dict[str, Any]:
    """Ship conversation ``session``'s cache to ``to`` if it should go, and say what
    happened."""
    held = lm.held(session)
    if held is None:
        return {"moved": False, "reason": "no longer held here"}
    if lm.source.kv_move == "never":
        return {"moved": False, "reason": "kv_move is never"}
    if not to.model.identity or to.model.identity != lm.identity:
        return {"moved": False, "reason": "not the same model file there"}
    if not may_hold(held.privacy, to.tier, to.node_id, held.origin):
        return {"moved": False, "reason": f"a {held.privacy.value} conversation's cache "
                                          f"stays off {to.tier.label}"}
    if lm.source.kv_move == "auto" and not worth_moving(lm, len(held.tokens),
                                                        held.cache.length, to):
        return {"moved": False, "reason": "prefilling there is expected to be faster"}
    start = time.perf_counter()
    try:
        blob, _ = await lm.export(session, lm.source.kv_codec)
        await put_package(http, to, session, blob, timeout_s)
    except TierlinkError as exc:
        return {"moved": False, "reason": exc.code, "detail": exc.message}
    return {"moved": True, "codec": lm.source.kv_codec, "bytes": len(blob),
            "tokens": len(held.tokens), "ms": round((time.perf_counter() - start) * 1e3, 1)}


async def put_package(http: aiohttp.ClientSession, to: Destination, session: str,
                      blob: bytes, timeout_s: float) -> None:
    """``blob`` (a package or a chain) held by ``to`` as conversation ``session``."""
    import aiohttp

    from tierlink.errors import UpstreamTimeout, UpstreamUnavailable

    url = to.url.rstrip("/") + kv_path(to.model.name)
    try:
        async with http.put(url, params={"session": session}, data=blob,
                            headers={"Content-Type": "application/octet-stream"},
                            timeout=aiohttp.ClientTimeout(total=timeout_s),
                            server_hostname=to.server_hostname) as r:
            await raise_unless_ok(r)
    except TimeoutError as exc:
        raise UpstreamTimeout(f"moving the cache to {to.node_id} timed out") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailable(f"moving the cache to {to.node_id} failed: {exc}") from exc


async def raise_unless_ok(r: aiohttp.ClientResponse) -> None:
    """A peer's answer other than 200 as the tierlink error its body names."""
    from tierlink.errors import error_from_dict

    if r.status == 200:
        return
    try:
        body = await r.json(content_type=None)
    except ValueError:
        body = {}
    raise error_from_dict(body if isinstance(body, dict) else {}, r.status)


def links_to(links: Iterable[LinkView], node_id: str) -> LinkView | None:
    return next((link for link in links if link.dst == node_id), None)
