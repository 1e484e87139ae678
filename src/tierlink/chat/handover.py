"""Conversations that move between nodes: a session's KV cache shipped to the node that
answers its next turn, so that node does not prefill the history again.

A node that holds a conversation's cache and relays its next turn to an upstream (the
policy placed the turn there) first ships the cache —
``PUT /tierlink/v1/llm/{model}/kv?session=…`` with a package (``llm/kvship.py``) — when

* the upstream's model computes the same caches (equal ``identity``: the same weights file,
  precision and kernels);
* privacy lets the upstream hold what the conversation's turns carried (the strictest of
  them: a ``local`` conversation's cache never leaves its device), checked here and again
  on arrival;
* moving is expected to beat prefilling there (``kv_move: auto``): the package's bytes over
  the link's estimated bandwidth plus a round trip against the history's tokens at the
  upstream's prefill rate. ``always`` ships whatever the estimate, ``never`` does not.

A shipment that fails leaves the upstream to prefill; the answer says which happened in its
``tierlink.kv`` (``moved``, ``codec``, ``bytes``, ``ms``, or ``reason``).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tierlink.core.types import LanguageModelView, LinkView, Tier
from tierlink.errors import InvalidRequest, ModelNotFound, PrivacyViolation, TierlinkError
from tierlink.llm.kvship import holder_of, package_bytes, read_header
from tierlink.routing.privacy import may_hold
from tierlink.security.names import expect_node

if TYPE_CHECKING:
    import aiohttp

    from tierlink.chat.openai import ChatRequest
    from tierlink.chat.service import Prepared
    from tierlink.llm.runtime import LanguageModel
    from tierlink.policy.chat import ChatOption
    from tierlink.telemetry.llm_metrics import LLMMetrics

HEADER_ALLOWANCE = 8 << 20  # the largest header a package may have (kvship.MAX_HEADER_BYTES)


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


def kv_path(model: str) -> str:
    return f"/tierlink/v1/llm/{model}/kv"


def worth_moving(lm: LanguageModel, tokens: int, slots: int, to: Destination) -> bool:
    """Whether shipping the cache is expected to beat the destination prefilling it."""
    if to.link is None or to.model.prefill_tok_s <= 0:
        return False
    size = package_bytes(lm.model.config, slots, lm.source.kv_codec)
    move_s = 2 * to.link.rtt_ms / 1e3 + size * 8 / (to.link.bandwidth_mbit * 1e6)
    return move_s < tokens / to.model.prefill_tok_s


class Handover:
    """The sending end: this node's conversations shipped ahead of the turns it relays."""

    def __init__(self, node_id: str, http: Callable[[], aiohttp.ClientSession],
                 tls: Callable[[], ssl.SSLContext | None],
                 links: Callable[[], Iterable[LinkView]],
                 metrics: LLMMetrics | None = None) -> None:
        self.node_id = node_id
        self._http = http
        self._tls = tls
        self._links = links
        self._metrics = metrics

    async def before_relay(self, req: ChatRequest, prep: Prepared, option: ChatOption,
                           url: str) -> dict[str, Any] | None:
        """Ship the cache of ``req``'s conversation to ``option``'s node when it should go
        (module docstring); what happened, for the answer's ``tierlink.kv`` (None: this
        node holds nothing of it)."""
        lm, session = prep.lm, req.tierlink.session
        held = lm.sessions.get(session) if lm is not None and session is not None else None
        if lm is None or session is None or held is None or held.busy or not held.tokens:
            return None
        to = self._destination(prep, option, url)
        outcome = await move(self._http(), lm, session, to, req.tierlink.deadline_ms / 1e3)
        if self._metrics is not None:
            self._metrics.kv_moves.labels(self._metrics.tier, lm.name, "out",
                                          "moved" if outcome["moved"] else "kept").inc()
            self._metrics.kv_move_bytes.labels(self._metrics.tier, lm.name, "out").inc(
                outcome.get("bytes", 0))
        return outcome

    def _destination(self, prep: Prepared, option: ChatOption, url: str) -> Destination:
        node = prep.view.nodes.get(option.node_id) if prep.view is not None else None
        model = next((m for m in node.language_models if m.name == option.model), None) \
            if node is not None else None
        return Destination(option.node_id, node.tier if node is not None else Tier.CLOUD,
                           model or LanguageModelView(option.model), url,
                           links_to(self._links(), option.node_id),
                           expect_node(option.node_id, self._tls()))


async def move(http: aiohttp.ClientSession, lm: LanguageModel, session: str, to: Destination,
               timeout_s: float) -> dict[str, Any]:
    """Ship conversation ``session``'s cache to ``to`` if it should go, and say what
    happened."""
    held = lm.sessions.get(session)
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
        await _put(http, to, session, blob, timeout_s)
    except TierlinkError as exc:
        return {"moved": False, "reason": exc.code, "detail": exc.message}
    return {"moved": True, "codec": lm.source.kv_codec, "bytes": len(blob),
            "tokens": len(held.tokens), "ms": round((time.perf_counter() - start) * 1e3, 1)}


async def _put(http: aiohttp.ClientSession, to: Destination, session: str, blob: bytes,
               timeout_s: float) -> None:
    import aiohttp

    from tierlink.errors import UpstreamTimeout, UpstreamUnavailable, error_from_dict

    url = to.url.rstrip("/") + kv_path(to.model.name)
    try:
        async with http.put(url, params={"session": session}, data=blob,
                            headers={"Content-Type": "application/octet-stream"},
                            timeout=aiohttp.ClientTimeout(total=timeout_s),
                            server_hostname=to.server_hostname) as r:
            if r.status != 200:
                try:
                    body = await r.json(content_type=None)
                except ValueError:
                    body = {}
                raise error_from_dict(body if isinstance(body, dict) else {}, r.status)
    except TimeoutError as exc:
        raise UpstreamTimeout(f"moving the cache to {to.node_id} timed out") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailable(f"moving the cache to {to.node_id} failed: {exc}") from exc


def install_kv_route(app: FastAPI, models: dict[str, LanguageModel], node_id: str,
                     tier: Tier, metrics: LLMMetrics | None = None) -> None:
    """The receiving end: a conversation's cache arrives and is held as its session."""

    @app.put(kv_path("{name}"))
    async def adopt(name: str, session: str, request: Request) -> Response:
        start = time.perf_counter()
        try:
            guard = getattr(request.app.state, "peers", None)
            if guard is not None:  # on a node with TLS: only a node of the fleet sends one
                guard.require(request.scope, "moving a conversation")
            lm = models.get(name)
            if lm is None:
                raise ModelNotFound(f"no language model {name!r} here to hold a conversation",
                                    hint=f"models: {sorted(models)}")
            if not 0 < len(session) <= 128:
                raise InvalidRequest("session must be a string of 1-128 characters",
                                     param="session")
            blob = await _body(request, _limit(lm))
            holder = holder_of(read_header(blob))
            if not may_hold(holder.privacy, tier, node_id, holder.origin):
                raise PrivacyViolation(f"a {holder.privacy.value} conversation from "
                                       f"{holder.origin} may not be held by {node_id} "
                                       f"({tier.label})")
            await lm.adopt(session, blob)
            if metrics is not None:
                metrics.kv_moves.labels(metrics.tier, name, "in", "moved").inc()
                metrics.kv_move_bytes.labels(metrics.tier, name, "in").inc(len(blob))
        except TierlinkError as exc:
            return JSONResponse(exc.to_dict(), exc.http_status)
        return JSONResponse({"session": session, "tokens": len(holder.tokens),
                             "bytes": len(blob),
                             "ms": round((time.perf_counter() - start) * 1e3, 1)})


def _limit(lm: LanguageModel) -> int:
    cfg = lm.model.config
    slots = (lm.bounds.max_tokens if lm.bounds is not None else None) or cfg.context_length
    return package_bytes(cfg, slots, "fp32") + HEADER_ALLOWANCE


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) past ``limit`` bytes before it is all read."""
    from tierlink.errors import PackageRefused

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    if not size:
        raise PackageRefused("the body is empty: a KV package was expected")
    return b"".join(chunks)


def _too_large(limit: int) -> TierlinkError:
    from tierlink.errors import PackageTooLarge

    return PackageTooLarge(f"a KV package is over this model's largest ({limit} bytes)")


def links_to(links: Iterable[LinkView], node_id: str) -> LinkView | None:
    return next((link for link in links if link.dst == node_id), None)
