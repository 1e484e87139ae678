"""The node's HTTP face: Open Inference Protocol v2 (REST) + ``/metrics`` + status.

Routes (KServe/Triton REST; binary tensor data extension supported both ways):

* ``GET  /v2``, ``/v2/health/live``, ``/v2/health/ready``
* ``GET  /v2/models/{name}[/versions/{v}]`` (metadata), ``.../ready``
* ``POST /v2/models/{name}[/versions/{v}]/infer``
* ``POST /v2/repository/index``
* ``GET  /metrics`` (Prometheus), ``GET /tierlink/v1/status`` (JSON)

``{name}`` is either a model variant this node serves (run here, raw outputs) or a *task*
(e.g. ``fmnist``): then the request is routed by the fleet's policy and answered with
``probabilities`` and ``label`` plus the outcome's routing parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from tierlink import __version__
from tierlink.core.types import Tier
from tierlink.errors import InvalidRequest, TierlinkError
from tierlink.node.answers import metadata, observed
from tierlink.node.inbox_routes import InboxReceiver, install_inbox_routes
from tierlink.node.infer_route import InferRoute, Reply, respond
from tierlink.node.overload import OverloadGate, ShedEarly
from tierlink.node.peers import PeerGuard
from tierlink.node.service import NodeService
from tierlink.settings.routing import OverloadConfig
from tierlink.telemetry import tracing
from tierlink.transport import oip
from tierlink.transport.openapi import (
    BYTES,
    OIP_INFER_REQUEST,
    OIP_REPOSITORY_INDEX,
    request_body,
)

if TYPE_CHECKING:
    from tierlink.chat.service import ChatService

log = logging.getLogger("tierlink.node")

FAULTS_BODY = {"type": "object", "properties": {"slowdown": {
    "type": "number", "exclusiveMinimum": 0, "description": "multiply compute time by this"}}}

def create_app(service: NodeService, ready: bool = False,
               chat: ChatService | None = None) -> FastAPI:
    """The app owns the service's lifetime (started and stopped in its lifespan), and the
    chat service's when the node serves language models. The routing config's ``overload``
    says how the node sheds its less urgent routed requests when its event loop falls
    behind (node/overload.py)."""

    receiver = _inbox_receiver(service)
    gate = _overload_gate(service, service.routing.overload)
    service.dispatcher.stall_ms = gate.stall_ms  # a held answer leaves before a stall
    guard = peer_guard(service)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tracing.prepare()  # not on the first request's clock
        await service.start()
        if chat is not None:
            chat.start()
        probe = asyncio.create_task(gate.run(), name="overload-probe")
        try:
            yield
        finally:
            for close in app.state.closing:  # other faces of the node first (gRPC)
                await close()
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
            if chat is not None:
                await chat.stop()
            await service.stop()
            if receiver is not None:
                receiver.close()

    app = FastAPI(title=f"tierlink node {service.spec.node_id}", version=__version__,
                  lifespan=lifespan, **framework_telemetry_off())
    app.state.ready = ready
    app.state.closing = []  # coroutines to await before the service stops
    app.state.overload = gate
    app.state.peers = guard
    # The inference route as plain ASGI, inside the early shedding (added first: inner).
    app.add_middleware(InferRoute, service=service, gate=gate, guard=guard, error=error_reply)
    app.add_middleware(ShedEarly, gate=gate, node_id=service.spec.node_id,
                       error_body=oip.error_body)
    if receiver is not None:  # what downstream nodes deliver (store-and-forward)
        install_inbox_routes(app, receiver, guard)

    @app.exception_handler(TierlinkError)
    async def _tierlink_error(_: Request, exc: TierlinkError) -> Response:
        return _error(exc)

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect) -> Response:
        # The caller gave up (its deadline passed) while sending: nobody reads this answer.
        return JSONResponse({"error": "client disconnected", "code": "client_disconnect"}, 499)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unexpected error")  # the process keeps serving
        return JSONResponse({"error": f"internal error: {exc}", "code": "internal"}, 500)

    _health_routes(app, service, guard)
    _model_routes(app, service, gate, guard)
    if chat is not None:
        from tierlink.chat.routes import install_chat_routes

        install_chat_routes(app, chat)
    return app


def framework_telemetry_off() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry (its releases from 0.165 on) turned off: the node records
    its own spans (telemetry/tracing.py), and the framework's checks of the global providers
    cost every request (an environment read each) even with nothing to record."""
    import inspect

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def error_reply(exc: TierlinkError) -> Reply:
    """A ``TierlinkError`` as the protocol's error answer: its status, its JSON body (the
    message, code and hint), ``Retry-After`` when it says when to come back."""
    retry = exc.details.get("retry_after_s")
    headers = {"content-type": "application/json"}
    if retry:
        headers["retry-after"] = str(max(1, math.ceil(float(retry))))
    return exc.http_status, headers, oip.error_body(exc)


def _error(exc: TierlinkError) -> Response:
    status, headers, body = error_reply(exc)
    return Response(body, status, headers=dict(headers))


async def _engine_status(service: NodeService) -> dict[str, Any]:
    """Where the node's models run: here (ONNX Runtime), or on Ray Serve with how many
    replicas each has now (asked of Serve's controller, off the event loop)."""
    remote = {n: rt for n, rt in service.runtimes.items() if getattr(rt, "remote", False)}
    if not remote:
        return {"kind": "onnxruntime"}
    from tierlink.node.ray_serve import replicas

    counts = await asyncio.to_thread(lambda: {n: replicas(rt) for n, rt in remote.items()})
    return {"kind": "ray", "replicas": counts}


def _overload_gate(service: NodeService, config: OverloadConfig) -> OverloadGate:
    metrics, tier = service.metrics, service.spec.tier.label
    gate = OverloadGate(config, on_shed=lambda p, outcome: metrics.overload_shed.labels(
        tier, p.label, outcome).inc())
    metrics.overload_level.labels(tier).set_function(lambda: gate.level)
    metrics.loop_lag.labels(tier).set_function(lambda: gate.lag_ms / 100.0)
    return gate


def peer_guard(service: NodeService) -> PeerGuard:
    """Claims bound to TLS senders on a node with TLS (node/peers.py); a node's tier is
    read from the current view."""
    def tier_of(node_id: str) -> Tier | None:
        node = service.view.nodes.get(node_id)
        return None if node is None else node.tier

    spec = service.spec
    return PeerGuard(spec.node_id, spec.tier, service.metrics, enabled=spec.tls_ca is not None,
                     tier_of=tier_of)


_PEER_OR_OPERATOR = ("node", "operator")


def _health_routes(app: FastAPI, service: NodeService, guard: PeerGuard) -> None:
    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "tierlink", "version": __version__,
                "extensions": ["binary_tensor_data", "model_repository", "tierlink_routing"]}

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        ok = bool(app.state.ready)
        return JSONResponse({"ready": ok}, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/tierlink/v1/status")
    async def status() -> dict[str, Any]:
        tls = getattr(app.state, "tls", None)  # the node's NodeTls (node/main.py)
        return {**service.status(), "overload": app.state.overload.snapshot(),
                "tls": None if tls is None else tls.status(),
                "engine": await _engine_status(service)}

    @app.post("/tierlink/v1/faults", openapi_extra=request_body(FAULTS_BODY))
    async def faults(request: Request) -> dict[str, Any]:
        """Fault injection (only with ``fault_injection`` in the spec): ``{"slowdown": N}``;
        on a node with TLS, for operators' and nodes' certificates only."""
        guard.require(request.scope, "fault injection", roles=_PEER_OR_OPERATOR)
        try:
            body = await request.json()
            slowdown = float(body.get("slowdown", 1.0))
        except (ValueError, TypeError, AttributeError) as exc:
            raise InvalidRequest(f"faults: expected {{\"slowdown\": N}}: {exc}") from None
        service.local.set_faults(slowdown)
        return {"slowdown": service.local.slowdown}

    @app.post("/tierlink/v1/probe", status_code=204, response_class=Response,
              openapi_extra=request_body(BYTES, media_type="application/octet-stream",
                                         required=False))
    async def probe(request: Request) -> Response:
        """A link probe: read the body (so its bytes cross the link) and answer empty."""
        guard.require(request.scope, "a link probe", roles=_PEER_OR_OPERATOR)
        await request.body()
        return Response(status_code=204)

    @app.post("/tierlink/v1/splits/{name}/open", status_code=204, response_class=Response)
    async def open_split(name: str, cut: str, request: Request) -> Response:
        """Open the tail of ``name`` at ``cut`` now (a device's split warmer asks, right
        after opening the matching head), so no request pays for it."""
        guard.require(request.scope, "opening a split", roles=_PEER_OR_OPERATOR)
        await service.split.open_tail(name, cut)
        return Response(status_code=204)

    @app.post("/v2/repository/index",
              openapi_extra=request_body(OIP_REPOSITORY_INDEX, required=False))
    async def repository_index() -> list[dict[str, Any]]:
        models = [{"name": n, "version": rt.info.version, "state": "READY"}
                  for n, rt in service.runtimes.items()]
        return models + [{"name": t, "version": "", "state": "READY", "reason": "routed task"}
                         for t in sorted(service.tasks())]


def _model_routes(app: FastAPI, service: NodeService, gate: OverloadGate,
                  guard: PeerGuard) -> None:
    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        return metadata(service, name, version)

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Response:
        metadata(service, name, version)  # raises ModelNotFound (404) when unknown
        return JSONResponse({"name": name, "ready": bool(app.state.ready)},
                            200 if app.state.ready else 503)

    @app.post("/v2/models/{name}/infer",
              openapi_extra=request_body(OIP_INFER_REQUEST, binary=True))
    @app.post("/v2/models/{name}/versions/{version}/infer",
              openapi_extra=request_body(OIP_INFER_REQUEST, binary=True))
    async def infer(name: str, request: Request, version: str | None = None) -> Response:
        # Answered by InferRoute before it gets here; declared for the OpenAPI document.
        body = await request.body()
        status, headers, out = await observed(service, name, lambda: respond(
            service, gate, guard, name, version, body, dict(request.headers), request.scope))
        return Response(out, status, headers=dict(headers))


def _inbox_receiver(service: NodeService) -> InboxReceiver | None:
    if service.uplink is None or service.spec.state_dir is None:
        return None
    return InboxReceiver.open(service.spec.state_dir, service.uplink)
