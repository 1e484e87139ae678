"""The OpenAI API on a node: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models`` — on every node, with or without a language model of its own — and, on
a node with one, the verifier's endpoint for speculative decoding,
``POST /tierlink/v1/llm/{model}/verify``. Errors answer in OpenAI's shape with the status
of tierlink's error tree (4xx for the caller's mistakes).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tierlink.chat import openai
from tierlink.chat.service import ChatService
from tierlink.errors import InvalidRequest, TierlinkError
from tierlink.transport.openapi import (
    OPENAI_CHAT_REQUEST,
    OPENAI_COMPLETION_REQUEST,
    request_body,
)


def install_chat_routes(app: FastAPI, chat: ChatService) -> None:
    if chat.models:  # a node with language models verifies drafts for its devices
        from tierlink.chat.verify import install_verify_route

        install_verify_route(app, chat.models)

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
    req = parse(await _json(request))
    prep = await chat.prepare(req)  # refusals come as a status, before any answer
    if not req.stream:
        return JSONResponse(await chat.complete(req, prep))
    return StreamingResponse(chat.stream(req, prep), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


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
