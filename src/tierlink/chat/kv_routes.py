"""A node's end of moving conversations (``chat/handover.py``):

* ``PUT /tierlink/v1/llm/{model}/kv?session=…`` — a conversation's cache arrives (a package,
  ``llm/kvship.py``) and is held as that session: refused with 403 when the conversation's
  privacy does not let this node hold it, 422 when it is not this model's or is broken, 413
  past the largest cache this model can hold, 409 while the session answers a turn here;
* ``POST /tierlink/v1/llm/kv/ship`` with ``{"session", "to": {node_id, tier, url, model}}``
  — the node that answered a conversation's last turn is asked (by the node its turns enter
  through) to ship the cache where the next turn goes; it answers what happened, as the
  answer's ``tierlink.kv`` says it;
* ``GET /tierlink/v1/llm/{model}/kv?session=…&since=N&evicted=E&for=NODE`` — the
  conversation's origin ``NODE`` takes a copy (``chat/copies.py``): the slots after ``N``
  (a delta; the whole cache when it has evicted other than ``E`` since), as a package; 403
  for any node but the conversation's origin, 404 when it is not held here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tierlink.chat.handover import SHIP_PATH, Destination, kv_path, move
from tierlink.errors import (
    InvalidRequest,
    PrivacyViolation,
    SessionNotFound,
    TierlinkError,
)
from tierlink.llm.kvship import MAX_HEADER_BYTES, holder_of, package_bytes, read_header
from tierlink.llm.source import model_named
from tierlink.routing.privacy import may_hold
from tierlink.security.names import expect_node

if TYPE_CHECKING:
    from tierlink.chat.service import ChatService
    from tierlink.llm.face import ServedModel



def install_kv_routes(app: FastAPI, chat: ChatService) -> None:
    models, metrics = chat.models, chat.metrics

    @app.put(kv_path("{name}"))
    async def adopt(name: str, session: str, request: Request) -> Response:
        start = time.perf_counter()
        try:
            _require_peer(request, "moving a conversation")
            lm = model_named(models, name, "to hold a conversation")
            _check_session(session)
            blob = await _body(request, _limit(lm))
            holder = holder_of(read_header(blob))
            if not may_hold(holder.privacy, chat.tier, chat.node_id, holder.origin):
                raise PrivacyViolation(f"a {holder.privacy.value} conversation from "
                                       f"{holder.origin} may not be held by {chat.node_id} "
                                       f"({chat.tier.label})")
            await lm.adopt(session, blob)
            if metrics is not None:
                metrics.kv_moves.labels(metrics.tier, name, "in", "moved").inc()
                metrics.kv_move_bytes.labels(metrics.tier, name, "in").inc(len(blob))
        except TierlinkError as exc:
            return JSONResponse(exc.to_dict(), exc.http_status)
        return JSONResponse({"session": session, "tokens": len(holder.tokens),
                             "bytes": len(blob),
                             "ms": round((time.perf_counter() - start) * 1e3, 1)})

    @app.get(kv_path("{name}"))
    async def copy(name: str, session: str, request: Request) -> Response:
        try:
            _require_peer(request, "copying a conversation")
            lm = model_named(models, name, "to hold a conversation")
            since, evicted, node = _copy_request(request)
            held = lm.held(session)
            if held is None:
                raise SessionNotFound(f"conversation {session!r} is not held here")
            if node != (held.origin or chat.node_id):
                raise PrivacyViolation(f"only conversation {session!r}'s origin "
                                       f"({held.origin}) may keep a copy of it, not {node}")
            blob, _ = await lm.export(session, lm.source.kv_codec, (since, evicted))
            if metrics is not None:
                metrics.kv_moves.labels(metrics.tier, name, "copy", "given").inc()
                metrics.kv_move_bytes.labels(metrics.tier, name, "copy").inc(len(blob))
        except TierlinkError as exc:
            return JSONResponse(exc.to_dict(), exc.http_status)
        return Response(blob, media_type="application/octet-stream")

    @app.post(SHIP_PATH)
    async def ship(request: Request) -> Response:
        try:
            _require_peer(request, "moving a conversation")
            session, to = _ship_request(await _json(request), chat)
            held = next((lm for lm in models.values() if lm.held(session) is not None),
                        None)
            if held is None:
                return JSONResponse({"moved": False, "reason": "no longer held here"})
            outcome = await move(chat.http(), held, session, to, SHIP_TIMEOUT_S)
            chat.handover.count(held.name, outcome)
        except TierlinkError as exc:
            return JSONResponse(exc.to_dict(), exc.http_status)
        return JSONResponse(outcome)


SHIP_TIMEOUT_S = 120.0  # a package of a long conversation over a slow link


def _ship_request(body: Any, chat: ChatService) -> tuple[str, Destination]:
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be {session, to}")
    session = body.get("session")
    if not isinstance(session, str):
        raise InvalidRequest("session must be a string", param="session")
    _check_session(session)
    to = Destination.from_dict(body.get("to"), chat.handover.links(),
                               lambda node: expect_node(node, chat.tls))
    return session, to


def _copy_request(request: Request) -> tuple[int, int, str]:
    """``since``, ``evicted`` and ``for`` of a copy request."""
    q = request.query_params
    node = q.get("for")
    if not node:
        raise InvalidRequest("for must name the node keeping the copy", param="for")
    try:
        since, evicted = int(q.get("since", "0")), int(q.get("evicted", "0"))
    except ValueError:
        raise InvalidRequest("since and evicted must be whole numbers of slots",
                             param="since") from None
    if since < 0 or evicted < 0:
        raise InvalidRequest("since and evicted must be >= 0", param="since")
    return since, evicted, node


def _require_peer(request: Request, what: str) -> None:
    guard = getattr(request.app.state, "peers", None)
    if guard is not None:  # on a node with TLS: only a node of the fleet asks
        guard.require(request.scope, what)


def _check_session(session: str) -> None:
    if not 0 < len(session) <= 128:
        raise InvalidRequest("session must be a string of 1-128 characters", param="session")


async def _json(request: Request) -> Any:
    import json

    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None


def _limit(lm: ServedModel) -> int:
    cfg = lm.config
    slots = (lm.bounds.max_tokens if lm.bounds is not None else None) or cfg.context_length
    return package_bytes(cfg, slots, "fp32") + MAX_HEADER_BYTES


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) past ``limit`` bytes before it is all read."""
    from tierlink.errors import PackageRefused, PackageTooLarge
    from tierlink.transport.bodies import read_bounded

    body = await read_bounded(request, limit, lambda _size: PackageTooLarge(
        f"a KV package is over this model's largest ({limit} bytes)"))
    if not body:
        raise PackageRefused("the body is empty: a KV package was expected")
    return body
