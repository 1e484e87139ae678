"""The OpenAI API's shapes: parse a request into what a node needs, write answers, stream
chunks and errors as OpenAI's clients expect them.

tierlink's own parameters travel in the body's ``tierlink`` object (the ``openai`` client's
``extra_body={"tierlink": {...}}``): ``deadline_ms``, ``privacy``, ``priority``, ``origin``,
``session`` (keep this conversation's KV cache for the next turn, and send its next turns to
the node holding it), ``ttft_ms`` (a target for the time to the first token) and
``min_tokens_per_s`` (a floor on the generation speed), which placement must meet,
``mode`` (``auto``: placed by policy,
``local``: this node's own model, ``speculative``: draft here, verify upstream, ``remote``:
the upstream's model answers alone, relayed through this node) and ``draft_ahead`` (whether a
speculative answer drafts its next round while one is verified; left out: the model's
setting). The answer carries a
``tierlink`` object: who served it, on which tier, along which path, the cost, the tokens
drafted and accepted (speculative decoding) and ``degraded``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tierlink.core.types import Priority, Privacy
from tierlink.errors import InvalidRequest, TierlinkError
from tierlink.llm.params import MAX_TOKENS_LIMIT, SamplingParams

UNSUPPORTED = ("tools", "functions", "logit_bias", "response_format", "audio")
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True, slots=True)
class TierlinkParams:
    deadline_ms: float = 30_000.0
    privacy: Privacy = Privacy.ANY
    priority: Priority = Priority.INTERACTIVE
    origin: str | None = None
    session: str | None = None
    hops: int = 0
    mode: str = "auto"  # auto | local | speculative | remote
    ttft_ms: float | None = None  # the first token within this long (placement's target)
    min_tokens_per_s: float | None = None  # generation at least this fast
    draft_ahead: bool | None = None  # None: the drafting model's own setting


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    kind: str  # "chat" | "completion"
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str = ""
    params: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    include_usage: bool = False
    tierlink: TierlinkParams = field(default_factory=TierlinkParams)


def parse_chat(body: Any) -> ChatRequest:
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages must be a list of {role, content} objects",
                             param="messages")
    if not messages:
        raise InvalidRequest("messages is empty", param="messages")
    return _parse(body, "chat", messages=tuple(dict(m) for m in messages))


def parse_completion(body: Any) -> ChatRequest:
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be one string", param="prompt")
    if not prompt:
        raise InvalidRequest("prompt is empty", param="prompt")
    return _parse(body, "completion", prompt=prompt)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    return body


def _parse(body: dict[str, Any], kind: str, **content: Any) -> ChatRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required (a model or a task this fleet serves)",
                             param="model")
    for name in UNSUPPORTED:
        if body.get(name):
            raise InvalidRequest(f"{name} is not supported by tierlink", param=name)
    n = body.get("n", 1)
    if n not in (1, None):
        raise InvalidRequest("n must be 1", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise InvalidRequest(f"{name} is not supported (send 0)", param=name)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise InvalidRequest("stream_options must be an object", param="stream_options")
    return ChatRequest(model=model, kind=kind, params=_sampling(body),
                       stream=_bool(body.get("stream", False), "stream"),
                       include_usage=bool(stream_options.get("include_usage", False)),
                       tierlink=_tierlink(body.get("tierlink")), **content)


def _sampling(body: dict[str, Any]) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) \
            or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise InvalidRequest(f"max_tokens must be an integer from 1 to {MAX_TOKENS_LIMIT}",
                             param="max_tokens")
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) for s in stops):
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise InvalidRequest("seed must be an integer", param="seed")
    try:
        return SamplingParams(max_tokens=max_tokens,
                              temperature=_number(body.get("temperature", 1.0), "temperature"),
                              top_p=_number(body.get("top_p", 1.0), "top_p"),
                              seed=seed, stop=stops,
                              ignore_eos=_bool(body.get("ignore_eos", False), "ignore_eos"))
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param=exc.message.split(" ")[0]) from None


def _tierlink(raw: Any) -> TierlinkParams:
    if raw is None:
        return TierlinkParams()
    if not isinstance(raw, dict):
        raise InvalidRequest("tierlink must be an object", param="tierlink")
    try:
        deadline = float(raw.get("deadline_ms", 30_000.0))
        privacy = Privacy.parse(raw.get("privacy", "any"))
        priority = Priority.parse(raw.get("priority", "interactive"))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"tierlink: {exc}", param="tierlink") from None
    if not deadline > 0:
        raise InvalidRequest("tierlink.deadline_ms must be positive", param="tierlink")
    session = raw.get("session")
    if session is not None and (not isinstance(session, str) or not 0 < len(session) <= 128):
        raise InvalidRequest("tierlink.session must be a string of 1-128 characters",
                             param="tierlink")
    hops = raw.get("hops", 0)
    mode = raw.get("mode", "auto")
    if not isinstance(mode, str):
        raise InvalidRequest("tierlink.mode must be a string", param="tierlink")
    ahead = raw.get("draft_ahead")
    if ahead is not None and not isinstance(ahead, bool):
        raise InvalidRequest("tierlink.draft_ahead must be true or false", param="tierlink")
    return TierlinkParams(deadline_ms=deadline, privacy=privacy, priority=priority,
                          origin=raw.get("origin"), session=session,
                          hops=hops if isinstance(hops, int) else 0, mode=mode,
                          ttft_ms=_positive(raw.get("ttft_ms"), "ttft_ms"),
                          min_tokens_per_s=_positive(raw.get("min_tokens_per_s"),
                                                     "min_tokens_per_s"), draft_ahead=ahead)


def _positive(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidRequest(f"tierlink.{name} must be a positive number", param="tierlink")
    return float(value)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{name} must be a number", param=name)
    return float(value)


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false", param=name)
    return value


# -- answers ---------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def answer(req: ChatRequest, rid: str, model: str, text: str, finish: str | None,
           use: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    created = int(time.time())
    if req.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None,
                                  "message": {"role": "assistant", "content": text}}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model,
            "choices": [choice], "usage": use, "tierlink": meta}


def chunk(req: ChatRequest, rid: str, model: str, text: str | None, finish: str | None,
          first: bool = False) -> dict[str, Any]:
    if req.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish,
                                  "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model,
            "choices": [choice]}


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


# -- errors ----------------------------------------------------------------------------

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 409: "conflict_error", 429: "rate_limit_error"}


def error_body(exc: TierlinkError) -> dict[str, Any]:
    """OpenAI's error object; the hint rides in the message, tierlink's code beside it."""
    status = exc.http_status
    oip_hint = exc.hint == InvalidRequest.hint  # the OIP default says nothing to a chat caller
    message = f"{exc.message} ({exc.hint})" if exc.hint and not oip_hint else exc.message
    return {"error": {"message": message,
                      "type": _TYPES.get(status, "server_error" if status >= 500
                                         else "invalid_request_error"),
                      "param": exc.details.get("param"), "code": exc.code}}
