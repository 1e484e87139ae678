"""On a node with TLS a chat request's claims are bound to its authenticated sender, as an
inference request's are: an application speaks for the node it calls, a node relays only
what it may, a `local` request never arrives from another node; verifying drafts takes a
node's certificate. (The sender's certificate reaches the app in the ASGI TLS extension;
here a middleware puts it there from a test header.)"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import FastAPI

from tierlink.chat.routes import install_chat_routes
from tierlink.chat.service import ChatService
from tierlink.chat.verify import install_verify_route
from tierlink.core.types import Tier
from tierlink.node.peers import PeerGuard
from tierlink.telemetry.metrics import NodeMetrics

MSG = [{"role": "user", "content": "hi"}]


class _AsIfTls:
    """Puts ``x-test-cert`` (a ``urn:tierlink:`` URI) where uvicorn's TLS protocol puts the
    verified client certificate."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            cert = dict(scope["headers"]).get(b"x-test-cert", b"").decode()
            scope = {**scope, "extensions": {"tls": {"client_cert_name": cert or None}}}
        await self.app(scope, receive, send)


def _node(tls: bool) -> tuple[FastAPI, NodeMetrics]:
    app = FastAPI()
    install_chat_routes(app, ChatService("edge-1", Tier.EDGE, {}, {}))
    install_verify_route(app, {"smollm2": object()})  # type: ignore[dict-item]  # never reached
    metrics = NodeMetrics("edge")
    tiers = {"dev-1": Tier.DEVICE, "dev-2": Tier.DEVICE, "edge-1": Tier.EDGE}
    app.state.peers = PeerGuard("edge-1", Tier.EDGE, metrics, enabled=tls, tier_of=tiers.get)
    app.add_middleware(_AsIfTls)
    return app, metrics


def _send(app: FastAPI, path: str, body: dict[str, Any], cert: str = "") -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://edge-1") as client:
            return await client.post(path, json=body, headers={"x-test-cert": cert})
    return asyncio.run(go())


def _chat(app: FastAPI, cert: str = "", **tierlink: Any) -> tuple[int, str]:
    r = _send(app, "/v1/chat/completions", {"model": "nope", "messages": MSG,
                                            "tierlink": tierlink}, cert)
    return r.status_code, r.text


DEV1, DEV2 = "urn:tierlink:node:device:dev-1", "urn:tierlink:node:device:dev-2"


def test_chat_claims_are_bound_to_the_sender() -> None:
    app, metrics = _node(tls=True)
    # Past the claims, the request fails on its model (404): that is what "allowed" looks like.
    assert _chat(app)[0] == 404  # an application, for the node it calls
    assert _chat(app, DEV1, origin="dev-1", hops=1)[0] == 404  # a device, its own input
    assert _chat(app, DEV1, hops=1)[0] == 404  # no origin named: the sender's
    for cert, claims, said in (
            ("", {"origin": "dev-1"}, "claims the input came from dev-1"),  # an app naming a node
            ("", {"hops": 1}, "relayed request"),  # an application relaying
            (DEV1, {"origin": "dev-2", "hops": 1}, "may not relay"),  # another device's input
            (DEV1, {"origin": "edge-1", "hops": 1}, "the node it sends to"),  # the receiver's
            (DEV1, {"privacy": "local", "hops": 1}, "never leaves its origin")):
        status, text = _chat(app, cert, **claims)
        assert status == 403 and "peer_refused" in text and said in text, (claims, text)
    refused = {s.labels["reason"]: s.value for m in metrics.registry.collect()
               if m.name == "tierlink_peer_refusals" for s in m.samples
               if s.name.endswith("_total")}
    assert refused == {"forged_origin": 3.0, "unauthenticated_peer": 1.0,
                       "local_forwarded": 1.0}


def test_without_tls_what_the_caller_says_stands() -> None:
    app, _ = _node(tls=False)
    assert _chat(app, "", origin="dev-1", hops=2)[0] == 404


def test_verifying_drafts_takes_a_node_certificate() -> None:
    app, _ = _node(tls=True)
    path = "/tierlink/v1/llm/smollm2/verify"
    anonymous = _send(app, path, {})
    assert anonymous.status_code == 403 and "unauthenticated_peer" in anonymous.text
    operator = _send(app, path, {}, "urn:tierlink:operator:ops")
    assert operator.status_code == 403
    assert _send(app, path, {}, DEV1).status_code == 400  # past the check: a bad body
