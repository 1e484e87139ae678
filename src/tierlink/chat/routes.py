"""The OpenAI API on a node: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models`` — on every node, with or without a language model of its own — and, on
a node with one, the verifier's endpoint for speculative decoding,
``POST /tierlink/v1/llm/{model}/verify``, and where a moved conversation's cache arrives,
``PUT /tierlink/v1/llm/{model}/kv?session=…``, and where a node is asked to ship one,
``POST /tierlink/v1/llm/kv/ship`` (``chat/kv_routes.py``). Errors answer in OpenAI's shape with the status
of tierlink's error tree (4xx for the caller's mistakes).

On a node with TLS a chat request's claims (its ``tierlink`` origin, hops and privacy) are
bound to the authenticated sender as an inference request's are (``node/peers.py``,
``security/claims.py``): an application speaks for the node it calls, a node relays only
what it may, and a ``local`` request never arrives from another node.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tierlink.chat import openai
from tierlink.chat.service import ChatService
from tierlink.errors import InvalidRequest, TierlinkError
from tierlink.security.claims import HOPS, ORIGIN, PRIVACY
from tierlink.transport.openapi import (
    OPENAI_CHAT_REQUEST,
    OPENAI_COMPLETION_REQUEST,
    request_body,
)


def install_chat_routes(app: FastAPI, chat: ChatService) -> None:
    if chat.models:  # a node with language models verifies drafts for its devices
        from tierlink.chat.kv_routes import install_kv_routes
        from tierlink.chat.splitting import install_split_routes
        from tierlink.chat.verify import install_verify_route

        install_verify_route(app, chat.models)
        install_split_routes(app, chat.models)
        install_kv_routes(app, chat)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return await chat.listing()

    @app.get("/v1/models/{name}")
    async def model(name: str) -> Response:
        return await _guard(_one_model(chat, name))

    @app.post("/v1/chat/completions", openapi_extra=request_body(OPENAI_CHAT_REQUEST))
    async def chat_completions(request: Request) -> Response:
        return await _guard(_answer(chat, request, openai.parse_chat))

    @app.post("/v1/completions", openapi_extra=request_body(OPENAI_COMPLETION_REQUEST))
    async def completions(request: Request) -> Response:
        return await _guard(_answer(chat, request, openai.parse_completion))


async def _one_model(chat: ChatService, name: str) -> Response:
    for entry in chat.model_list():
        if entry["id"] == name:
            return JSONResponse(entry)
    chat.resolve(name)  # raises ModelNotFound
    raise AssertionError("unreachable")


async def _answer(chat: ChatService, request: Request,
                  parse: Callable[[Any], openai.ChatRequest]) -> Response:
    req = _bound(request, parse(await _json(request)))
    prep = await chat.prepare(req)  # refusals come as a status, before any answer
    if not req.stream:
        return JSONResponse(await chat.complete(req, prep))
    return StreamingResponse(chat.stream(req, prep), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _bound(request: Request, req: openai.ChatRequest) -> openai.ChatRequest:
    """``req`` with its origin bound to the TLS sender; raises ``PeerRefused`` (403,
    counted) when the sender may not claim what it says. As it is without TLS."""
    guard = getattr(request.app.state, "peers", None)
    if guard is None or not guard.enabled:
        return req
    t = req.tierlink
    bound = guard.bind(request.scope, {ORIGIN: t.origin or "", HOPS: t.hops,
                                       PRIVACY: t.privacy.value})
    origin = str(bound.get(ORIGIN) or "") or None
    return req if origin == t.origin else replace(req, tierlink=replace(t, origin=origin))


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None


async def _guard(work: Awaitable[Response]) -> Response:
    try:
        return await work
    except TierlinkError as exc:
        return JSONResponse(openai.error_body(exc), exc.http_status)
