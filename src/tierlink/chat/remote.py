"""Forwarding a chat request to an upstream node's model and relaying its stream.

The request travels as an OpenAI request (the upstream is any tierlink node, or any server
that speaks the API), with the remaining deadline, the privacy level, ``origin`` and one more
hop in its ``tierlink`` object, and ``mode: local`` so it is answered there, not forwarded
again. Errors come back as tierlink errors of the same code (a 4xx stays a 4xx).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from tierlink.chat.openai import ChatRequest
from tierlink.errors import (
    TierlinkError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_from_dict,
)
from tierlink.llm.results import Chunk, Generation


def forward_body(req: ChatRequest, model: str, origin: str) -> dict[str, Any]:
    p = req.params
    body: dict[str, Any] = {
        "model": model, "max_tokens": p.max_tokens, "temperature": p.temperature,
        "top_p": p.top_p, "stream": True, "stream_options": {"include_usage": True},
        "tierlink": {"deadline_ms": req.tierlink.deadline_ms,
                     "privacy": req.tierlink.privacy.value,
                     "priority": req.tierlink.priority.label,
                     "origin": req.tierlink.origin or origin, "hops": req.tierlink.hops + 1,
                     "mode": "local"}}
    if req.tierlink.session is not None:  # the upstream keeps the conversation's cache
        body["tierlink"]["session"] = req.tierlink.session
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    if p.ignore_eos:
        body["ignore_eos"] = True
    if req.kind == "chat":
        body["messages"] = list(req.messages)
    else:
        body["prompt"] = req.prompt
    return body


async def relay(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                report: Generation, meta: dict[str, Any],
                server_hostname: str | None = None) -> AsyncIterator[Chunk]:
    """POST the request upstream and yield its pieces; usage and ``tierlink`` land in
    ``report`` and ``meta``. ``server_hostname``: the upstream's identity name, which TLS
    checks (``security.names.expect_node``)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    timeout = aiohttp.ClientTimeout(total=body["tierlink"]["deadline_ms"] / 1e3)
    try:
        async with http.post(url.rstrip("/") + path, json=body, timeout=timeout,
                             server_hostname=server_hostname) as r:
            if r.status != 200:
                raise _error(await r.read(), r.status)
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    raise _error(json.dumps(data).encode(), 502)
                piece = _piece(data)
                if data.get("usage"):
                    _usage(data["usage"], report)
                    meta.update(data.get("tierlink") or {})
                if piece is not None:
                    report.text.append(piece.text)
                    if piece.finish_reason:
                        report.finish_reason = piece.finish_reason
                    yield piece
    except TimeoutError as exc:
        raise UpstreamTimeout(f"the upstream model did not finish in time: {exc}") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailable(f"the upstream model is unreachable: {exc}") from exc


def _piece(data: dict[str, Any]) -> Chunk | None:
    choices = data.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content") or ""
    return Chunk(text, [], choice.get("finish_reason"))


def _usage(use: dict[str, Any], report: Generation) -> None:
    report.prompt_tokens = int(use.get("prompt_tokens", 0))
    report.completion_tokens = int(use.get("completion_tokens", 0))
    details = use.get("prompt_tokens_details") or {}
    report.cached_tokens = int(details.get("cached_tokens", 0) or 0)


def _error(raw: bytes, status: int) -> TierlinkError:
    try:
        err = json.loads(raw).get("error", {})
    except ValueError:
        err = {}
    if not isinstance(err, dict):
        err = {"message": str(err)}
    return error_from_dict({"error": f"upstream: {err.get('message', f'HTTP {status}')}",
                            "code": err.get("code", "")}, status)
