"""The wire of speculative decoding: a device's verify call and the verifier's route.

``POST /tierlink/v1/llm/{model}/verify`` with ``{"session", "tokens", "drafts": [{"token",
"support", "probs"}], "sampling": {"temperature", "top_p", "seed"}}`` answers
``{"accepted", "tokens", "server_ms"}``. ``session`` names the device's sequence, so the
verifier keeps its KV cache between rounds and feeds only what is new.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tierlink.chat.sequence import UpstreamSequence
from tierlink.errors import InvalidRequest, TierlinkError
from tierlink.llm.face import ServedModel
from tierlink.llm.sampling import Proposal, SamplingParams, Verdict
from tierlink.llm.source import model_named
from tierlink.transport.openapi import request_body

MAX_DRAFTS = 16
VERIFY_REQUEST = {  # a drafting node's round (chat/remote.py)
    "type": "object", "required": ["tokens", "drafts"],
    "properties": {
        "session": {"type": "string"},
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0},
                   "description": "the sequence so far, as this model's token ids"},
        "drafts": {"type": "array", "maxItems": MAX_DRAFTS, "items": {
            "type": "object", "required": ["token"],
            "properties": {"token": {"type": "integer", "minimum": 0},
                           "support": {"type": "array", "items": {"type": "integer"}},
                           "probs": {"type": "array", "items": {"type": "number"}}}}},
        "sampling": {"type": "object", "properties": {
            "temperature": {"type": "number", "minimum": 0},
            "top_p": {"type": "number"}, "seed": {"type": "integer"}}}}}


def install_verify_route(app: FastAPI, models: dict[str, ServedModel]) -> None:
    @app.post("/tierlink/v1/llm/{name}/verify", openapi_extra=request_body(VERIFY_REQUEST))
    async def verify(name: str, request: Request) -> Response:
        start = time.perf_counter()
        try:
            guard = getattr(request.app.state, "peers", None)
            if guard is not None:  # on a node with TLS: a drafting node's certificate
                guard.require(request.scope, "verifying drafts")
            lm = model_named(models, name, "to verify with")
            key, tokens, drafts, params = parse_verify(await request.json(), lm)
            verdict = await lm.verify(key, tokens, drafts, params)
        except TierlinkError as exc:
            return JSONResponse(exc.to_dict(), exc.http_status)
        except ValueError as exc:
            return JSONResponse({"error": f"verify: {exc}", "code": "invalid_request"}, 400)
        return JSONResponse({"accepted": verdict.accepted, "tokens": list(verdict.tokens),
                             "server_ms": round((time.perf_counter() - start) * 1e3, 3)})


    @app.delete("/tierlink/v1/llm/{name}/verify/{session}", status_code=204,
                response_class=Response)
    async def release(name: str, session: str) -> Response:
        """The drafting device is done with this sequence: free its cache here."""
        lm = models.get(name)
        if lm is not None:
            lm.release(session)
        return Response(status_code=204)


def parse_verify(body: Any, lm: ServedModel) -> tuple[str, list[int], list[Proposal],
                                                         SamplingParams]:
    if not isinstance(body, dict):
        raise InvalidRequest("verify: the body must be an object")
    key = body.get("session")
    if not isinstance(key, str) or not 0 < len(key) <= 200:
        raise InvalidRequest("verify: session must be a string")
    vocab = lm.config.vocab_size
    tokens = _ids(body.get("tokens"), vocab, "tokens")
    raw = body.get("drafts")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_DRAFTS:
        raise InvalidRequest(f"verify: drafts must be a list of 1 to {MAX_DRAFTS} proposals")
    drafts = [_proposal(d, vocab) for d in raw]
    s = body.get("sampling") or {}
    params = SamplingParams(max_tokens=1, temperature=float(s.get("temperature", 0.0)),
                            top_p=float(s.get("top_p", 1.0)), seed=s.get("seed"))
    return key, tokens, drafts, params


def _ids(value: Any, vocab: int, name: str) -> list[int]:
    if not isinstance(value, list) or not value or \
            not all(isinstance(t, int) and 0 <= t < vocab for t in value):
        raise InvalidRequest(f"verify: {name} must be a non-empty list of token ids "
                             f"below {vocab}")
    return value


def _proposal(d: Any, vocab: int) -> Proposal:
    if not isinstance(d, dict):
        raise InvalidRequest("verify: each draft is {token, support, probs}")
    token = _ids([d.get("token")], vocab, "draft token")[0]
    support = d.get("support") or []
    probs = d.get("probs") or []
    if support:
        _ids(support, vocab, "support")
    if len(support) != len(probs) or not all(isinstance(p, int | float) and 0 <= p <= 1
                                             for p in probs):
        raise InvalidRequest("verify: support and probs must pair up, probs in [0, 1]")
    if support and token not in support:
        raise InvalidRequest("verify: a sampled draft's token must be in its support")
    return Proposal(token, tuple(support), tuple(float(p) for p in probs))


class HttpVerifier(UpstreamSequence):
    """A device's side of the wire: one session per generation, over a pooled session."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str, key: str,
                 timeout_s: float = 10.0, server_hostname: str | None = None) -> None:
        super().__init__(session, f"{url.rstrip('/')}/tierlink/v1/llm/{model}/verify", key,
                         timeout_s, server_hostname, "verifier")

    async def __call__(self, tokens: list[int], drafts: list[Proposal],
                       params: SamplingParams) -> Verdict:
        body = {"session": self.key, "tokens": tokens,
                "drafts": [{"token": d.token, "support": list(d.support),
                            "probs": list(d.probs)} for d in drafts],
                "sampling": {"temperature": params.temperature, "top_p": params.top_p,
                             "seed": params.seed}}
        data = await self.call(json=body)
        return Verdict(int(data["accepted"]), tuple(int(t) for t in data["tokens"]))
