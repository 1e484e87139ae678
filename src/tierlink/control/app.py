"""The control plane's HTTP API: the fleet registry.

    POST   /v1/nodes/{node_id}/heartbeat   a node's full state, about once a second
    GET    /v1/nodes                       alive nodes: {"nodes": [NodeRecord...], "ttl_s", "now"}
    GET    /v1/nodes/{node_id}             one alive node (404 when unknown or expired)
    DELETE /v1/nodes/{node_id}             graceful deregistration on node shutdown (204)
    GET    /healthz                        the store answers
    GET    /metrics                        Prometheus text exposition

A node is alive while its last heartbeat is at most ``ttl_s`` old; a background task marks
silent nodes expired every ``sweep_interval_s``. The registry is not on the request path:
nodes route from their cached copy of ``GET /v1/nodes`` and keep going while it is away.

Errors are ``{"error", "code", "hint"}`` JSON, from the :mod:`tierlink.errors` tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# This module is the web adapter: importing it means serving, so fastapi is imported here.
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from tierlink.control.schemas import Heartbeat, NodeRecord, format_error_list
from tierlink.control.store import RegistryStore
from tierlink.errors import ConfigError, TierlinkError

log = logging.getLogger(__name__)

Clock = Callable[[], float]
TIERS = ("device", "edge", "cloud")
_HEARTBEAT_HINT = "send the fields of tierlink.control.schemas.Heartbeat as JSON"


@dataclass(frozen=True)
class ControlMetrics:
    """The control plane's Prometheus series, in a registry of their own (one per app)."""

    registry: CollectorRegistry
    nodes: Gauge
    heartbeats: Counter
    expired: Counter
    request_duration: Histogram

    @classmethod
    def create(cls) -> ControlMetrics:
        registry = CollectorRegistry(auto_describe=True)
        return cls(
            registry=registry,
            nodes=Gauge("tierlink_control_nodes", "Alive nodes by tier.", ["tier"],
                        registry=registry),
            heartbeats=Counter("tierlink_control_heartbeats", "Heartbeats accepted.",
                               registry=registry),
            expired=Counter("tierlink_control_expired", "Nodes expired for going silent.",
                            registry=registry),
            request_duration=Histogram(
                "tierlink_control_request_duration_seconds",
                "Control plane HTTP request duration.", ["method", "route", "status"],
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                registry=registry,
            ),
        )


class RegistryService:
    """What the endpoints do, apart from HTTP: store access on the injected clock, metrics.

    Kept on ``app.state.registry`` so tests can drive a sweep without waiting for the task.
    """

    def __init__(self, store: RegistryStore, clock: Clock, ttl_s: float,
                 metrics: ControlMetrics) -> None:
        self.store = store
        self.clock = clock
        self.ttl_s = ttl_s
        self.metrics = metrics

    def heartbeat(self, heartbeat: Heartbeat) -> NodeRecord:
        now = self.clock()
        record = self.store.upsert(heartbeat, now, self.ttl_s)
        self.metrics.heartbeats.inc()
        if record.registered_at == now:  # the store starts a generation at exactly ``now``
            log.info("node %s (%s, %s) registered, generation %d", record.node_id,
                     record.tier, record.address, record.generation)
        return record

    def alive(self) -> tuple[float, list[NodeRecord]]:
        now = self.clock()
        return now, self.store.alive(now, self.ttl_s)

    def get(self, node_id: str) -> NodeRecord | None:
        record = self.store.get(node_id, self.clock())
        # Silent past the ttl but not swept yet: as good as expired.
        return record if record is not None and record.age_s <= self.ttl_s else None

    def deregister(self, node_id: str) -> bool:
        removed = self.store.remove(node_id)
        if removed:
            log.info("node %s deregistered", node_id)
        return removed

    def sweep(self) -> list[str]:
        """Expire silent nodes now; returns their ids. The background task calls this."""
        expired = self.store.expire(self.clock(), self.ttl_s)
        if expired:
            self.metrics.expired.inc(len(expired))
            log.info("expired silent nodes (no heartbeat for %.1f s): %s", self.ttl_s,
                     ", ".join(expired))
        return expired

    def update_gauges(self) -> None:
        counts = dict.fromkeys(TIERS, 0)
        for record in self.alive()[1]:
            counts[record.tier] += 1
        for tier, count in counts.items():
            self.metrics.nodes.labels(tier=tier).set(count)


def create_app(
    store: RegistryStore,
    clock: Clock = time.time,
    ttl_s: float = 5.0,
    *,
    sweep_interval_s: float = 1.0,
) -> FastAPI:
    """The registry app over ``store``. The caller owns ``store`` and closes it after the
    app has shut down. ``clock`` (epoch seconds) decides liveness; the expiry task runs
    every ``sweep_interval_s`` of real time while the app's lifespan is running."""
    if ttl_s <= 0 or sweep_interval_s <= 0:
        raise ConfigError(
            f"ttl_s ({ttl_s}) and sweep_interval_s ({sweep_interval_s}) must be positive",
            hint="pass e.g. --ttl 5 (seconds a silent node stays listed)",
        )
    service = RegistryService(store, clock, float(ttl_s), ControlMetrics.create())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_sweep_forever(service, sweep_interval_s),
                                   name="tierlink-control-sweep")
        app.state.sweep_task = task  # for tests: done (cancelled) once shut down
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="tierlink control plane", version="1", lifespan=lifespan)
    app.state.registry = service
    _install_error_handlers(app)
    _install_timing(app, service.metrics)
    _install_routes(app, service)
    return app


def _install_routes(app: FastAPI, service: RegistryService) -> None:
    @app.post("/v1/nodes/{node_id}/heartbeat")
    def heartbeat(node_id: str, body: Heartbeat) -> Any:
        if body.node_id != node_id:
            return _error(422, f"invalid heartbeat: node_id: {body.node_id!r} does not match "
                          f"the path's node id {node_id!r}", "invalid_request",
                          "post to /v1/nodes/{the body's node_id}/heartbeat")
        record = service.heartbeat(body)
        return {"node_id": record.node_id, "generation": record.generation,
                "registered_at": record.registered_at, "ttl_s": service.ttl_s}

    @app.get("/v1/nodes")
    def nodes() -> dict[str, Any]:
        now, records = service.alive()
        return {"nodes": [r.model_dump(mode="json") for r in records],
                "ttl_s": service.ttl_s, "now": now}

    @app.get("/v1/nodes/{node_id}")
    def node(node_id: str) -> Any:
        record = service.get(node_id)
        return _unknown(node_id) if record is None else record.model_dump(mode="json")

    @app.delete("/v1/nodes/{node_id}", status_code=204, response_class=Response)
    def deregister(node_id: str) -> Response:
        if not service.deregister(node_id):
            return _unknown(node_id)
        return Response(status_code=204)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "nodes": len(service.alive()[1])}

    @app.get("/metrics")
    def metrics() -> Response:
        service.update_gauges()
        return Response(generate_latest(service.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)


def _unknown(node_id: str) -> Response:
    return _error(404, f"node {node_id!r} is not registered (unknown, expired or deregistered)",
                  "node_not_found", "list the alive nodes with GET /v1/nodes")


def _error(status: int, message: str, code: str, hint: str) -> Response:
    return JSONResponse({"error": message, "code": code, "hint": hint}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, exc: RequestValidationError) -> Response:
        message = format_error_list(exc.errors(), what="heartbeat", strip_first=True)
        return _error(422, message, "invalid_request", _HEARTBEAT_HINT)

    @app.exception_handler(TierlinkError)
    async def tierlink_error(_request: Request, exc: TierlinkError) -> Response:
        log.warning("control plane error: %s", exc)
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)


def _install_timing(app: FastAPI, metrics: ControlMetrics) -> None:
    @app.middleware("http")
    async def timed(request: Request, call_next: Callable[[Request], Awaitable[Response]]
                    ) -> Response:
        start = time.perf_counter()  # a duration, not a point in time: real clock on purpose
        response = await call_next(request)
        route = request.scope.get("route")
        metrics.request_duration.labels(
            method=request.method,
            route=getattr(route, "path", "unmatched"),  # the template: bounded cardinality
            status=str(response.status_code),
        ).observe(time.perf_counter() - start)
        return response


async def _sweep_forever(service: RegistryService, interval_s: float) -> None:
    """Expire silent nodes every ``interval_s`` until cancelled; never dies on an error."""
    failing = False
    while True:
        await asyncio.sleep(interval_s)
        try:
            # Called on the loop, not in a thread: the statement is tiny, and a thread
            # could still be running it after shutdown has closed the store.
            service.sweep()
        except Exception:
            if not failing:  # once per failure streak, not every second
                log.exception("expiry sweep failed; retrying every %.1f s", interval_s)
            failing = True
        else:
            failing = False
