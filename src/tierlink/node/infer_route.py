"""The REST inference route, ``POST /v2/models/{name}[/versions/{v}]/infer``, as plain ASGI.

A small request's node CPU was a third web framework: routing, path-parameter validation,
dependency solving and exception plumbing around a handler that needs none of it. This
middleware answers the route itself, inside the overload gate's early shedding
(``ShedEarly``) and the framework's outer guards (body limit, server errors), with the same
answers, errors and metrics (``node/answers.py``); every other path goes on to the app. The
framework's own route stays declared for the OpenAPI document and calls the same
:func:`respond`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import unquote

from starlette.requests import ClientDisconnect

from tierlink.errors import TensorError, TierlinkError
from tierlink.node.answers import answer, observed
from tierlink.node.overload import JUDGED, OverloadGate
from tierlink.node.peers import PeerGuard
from tierlink.node.service import NodeService
from tierlink.transport import oip

__all__ = ["InferRoute", "Reply", "respond"]

log = logging.getLogger("tierlink.node")

_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")

Reply = tuple[int, Mapping[str, str], bytes]  # status, headers, body


async def respond(service: NodeService, gate: OverloadGate, guard: PeerGuard, name: str,
                  version: str | None, body: bytes, headers: Mapping[str, str],
                  scope: Any) -> Reply:
    """One REST inference request answered: ``headers`` lower-case, ``scope`` the ASGI
    scope (the TLS sender the claims bind to, the priority ``ShedEarly`` judged)."""
    data = oip.decode_infer_request(body, _header_length(headers),
                                    headers.get("content-encoding"))
    judged = (scope.get("state") or {}).get(JUDGED)
    done = await answer(service, name, version, data,
                        lambda params: guard.bind(scope, params), gate, judged)
    if done.accepted is not None:
        return 202, {"content-type": "application/json"}, json.dumps(done.accepted).encode()
    out, out_headers = oip.encode_infer_response(done.name, done.version, done.id,
                                                 done.outputs, done.parameters,
                                                 data.binary_outputs(done.outputs))
    return 200, out_headers, out


class InferRoute:
    """ASGI middleware answering the inference route; ``error`` is the app's error body
    for a ``TierlinkError`` (status, headers, body)."""

    def __init__(self, app: Any, service: NodeService, gate: OverloadGate, guard: PeerGuard,
                 error: Callable[[TierlinkError], Reply]) -> None:
        self.app, self.service, self.gate, self.guard = app, service, gate, guard
        self._error = error

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        found = (_PATH.match(scope["path"]) if scope["type"] == "http"
                 and scope["method"] == "POST" else None)
        if found is None:
            await self.app(scope, receive, send)
            return
        name, version = unquote(found[1]), found[2] and unquote(found[2])
        status, headers, body = await self._reply(name, version, scope, receive)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                for k, v in {**headers,
                                             "content-length": str(len(body))}.items()]})
        await send({"type": "http.response.body", "body": body})

    async def _reply(self, name: str, version: str | None, scope: Any,
                     receive: Callable[[], Awaitable[Any]]) -> Reply:
        try:
            return await observed(self.service, name, lambda: self._answer(
                name, version, scope, receive))
        except TierlinkError as exc:
            return self._error(exc)
        except ClientDisconnect:  # the caller gave up while sending: nobody reads this
            return 499, {"content-type": "application/json"}, \
                b'{"error":"client disconnected","code":"client_disconnect"}'
        except Exception as exc:  # the process keeps serving
            log.exception("unexpected error")
            body = json.dumps({"error": f"internal error: {exc}", "code": "internal"})
            return 500, {"content-type": "application/json"}, body.encode()

    async def _answer(self, name: str, version: str | None, scope: Any,
                      receive: Callable[[], Awaitable[Any]]) -> Reply:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        body = await _body(receive)
        return await respond(self.service, self.gate, self.guard, name, version, body,
                             headers, scope)


async def _body(receive: Callable[[], Awaitable[Any]]) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header_length(headers: Mapping[str, str]) -> int | None:
    raw = headers.get("inference-header-content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise TensorError(f"Inference-Header-Content-Length must be an integer, got {raw!r}") \
            from None
