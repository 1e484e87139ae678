"""The control plane's HTTP API: the fleet registry.

    POST   /v1/nodes/{node_id}/heartbeat   a node's full state, about once a second
    GET    /v1/nodes                       alive nodes: {"nodes": [NodeRecord...], "ttl_s", "now",
                                           "revision"}; ?splits=digest: each model's "splits"
                                           replaced by "splits_digest" (the nodes' own view:
                                           profiles are most of the bytes and rarely change);
                                           ?since=REVISION&wait=S: a watch (at most S s, then
                                           {"unchanged": true, "revision"}; see view_watch.py)
    GET    /v1/splits/{digest}             one split profile: {"digest", "splits"} (404 when
                                           no alive node reports it)
    GET    /v1/nodes/{node_id}             one alive node (404 when unknown or expired)
    DELETE /v1/nodes/{node_id}             graceful deregistration on node shutdown (204)
    POST   /v1/nodes/{node_id}/drain       (operator) peers send it no new work; it finishes
                                           what it holds (DELETE: undo). Records say
                                           ``draining``; kept across the node's restarts
    POST   /v1/hard-examples               a node's batch of hard examples (HardExampleBatch)
    GET    /v1/hard-examples               their metadata: ?model=&node=&after_id=&limit=
    GET    /v1/hard-examples/export        an .npz of them with their inputs: ?model=&node=&limit=
    POST   /v1/enroll                      a node enrolls: {token, node_id, tier} -> {secret}
    POST   /v1/enrollment-tokens           (operator) a new enrollment token
    GET    /v1/credentials                 (operator) enrolled nodes, revoked ones marked
    POST   /v1/credentials/{node_id}/revoke (operator) revoke a node; it leaves the registry
    PUT    /v1/blobs/{sha256}, GET /v1/models...  the model repository (tierlink.repo.routes)
    POST   /v1/rollouts, GET /v1/rollouts...     rollouts (tierlink.control.rollout_routes)
    POST   /v1/results                     a node delivers store-and-forward items (per-item acks);
                                           kind hard_example goes to the hard-example store
    GET    /v1/results, /v1/results/{key}  delivered results (tierlink.control.results)
    POST   /v1/rollouts, GET /v1/rollouts[/{id}], POST /v1/rollouts/{id}/{action}
                                           (operator) staged rollouts
                                           (tierlink.control.rollout_routes)
    GET    /v1/routing, PUT /v1/routing, POST /v1/routing/revert
                                           the fleet's routing revisions (writes: operator;
                                           tierlink.control.routing_routes)
    GET    /healthz                        the store answers
    GET    /metrics                        Prometheus text exposition

A node is alive while its last heartbeat is at most ``ttl_s`` old; a background task marks
silent nodes expired every ``sweep_interval_s``. The heartbeat answer carries ``desired``:
per model under a rollout, the version (and weight) the node should serve
(:class:`~tierlink.control.rollouts.RolloutController`, stepped by another background task
every ``rollout_interval_s``). The registry is not on the request path:
nodes route from their cached copy of ``GET /v1/nodes`` and keep going while it is away.

Hard examples are inputs a node escalated for low confidence and whose privacy level lets
them reach the control plane (the node decides; the store still refuses ``local`` ones).
A malformed batch (e.g. a tensor whose bytes do not match its shape) is a 400 naming the
field; a failing disk is a 503 and the registry keeps serving; a node posting another node's
examples is a 403 and nothing of that batch is stored. Nodes with a state directory
deliver them through their outbox instead (``POST /v1/results``, kind ``hard_example``, one
example per item): each is validated alone (a bad one is answered ``rejected``), must come
from the node it names, and is stored once by idempotency key and by the store's own key.

With an :class:`~tierlink.control.identity.Identity` (``tierlink control`` always has
one; tests may leave it out) every call but ``/healthz``, ``/metrics`` and ``/v1/enroll``
needs ``Authorization: Bearer node:<id>:<secret>`` or ``Bearer admin:<token>``; who may call
what is :func:`tierlink.control.identity.access_rule`. Unknown or revoked nodes get a 401.

Errors are ``{"error", "code", "hint"}`` JSON, from the :mod:`tierlink.errors` tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

# This module is the web adapter: importing it means serving, so fastapi is imported here.
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tierlink.control.auth import install_auth, install_identity_routes
from tierlink.control.fleet_routes import install_fleet_routes
from tierlink.control.fleet_view import FleetView
from tierlink.control.hard_examples import HardExampleService, install_hard_example_routes
from tierlink.control.identity import Identity
from tierlink.control.metrics import ControlMetrics
from tierlink.control.registry import RegistryService, install_registry_routes
from tierlink.control.responses import error_response
from tierlink.control.results import DEFAULT_MAX_ROWS as DEFAULT_RESULT_ROWS
from tierlink.control.results import (
    DeliveredResults,
    ResultMetrics,
    ResultStore,
    install_result_routes,
)
from tierlink.control.rollout_routes import install_rollout_routes
from tierlink.control.rollouts import RolloutController, Rollouts, RolloutStore
from tierlink.control.routing_revisions import (
    RoutingControl,
    RoutingRevisions,
    SqliteRoutingRevisions,
)
from tierlink.control.routing_routes import install_routing_routes
from tierlink.control.schemas import format_error_list
from tierlink.control.store import (
    HardExampleStore,
    RegistryStore,
    SqliteHardExampleStore,
    SqliteRegistryStore,
)
from tierlink.errors import ConfigError, TierlinkError
from tierlink.repo.routes import install_repository_routes
from tierlink.repo.service import RepositoryService

if TYPE_CHECKING:
    from tierlink.security.pki import Authority

log = logging.getLogger(__name__)

Clock = Callable[[], float]
_HEARTBEAT_HINT = "send the fields of tierlink.control.schemas.Heartbeat as JSON"
_ROLLOUT_HINT = ("send {\"name\", \"version\", \"tier\"} and optional fields of "
                 "tierlink.control.schemas.RolloutIn as JSON")


def create_app(
    store: RegistryStore,
    clock: Clock = time.time,
    ttl_s: float = 5.0,
    *,
    sweep_interval_s: float = 1.0,
    hard_examples: HardExampleStore | None = None,
    hard_example_max_rows: int = 50_000,
    result_max_rows: int = DEFAULT_RESULT_ROWS,
    results: DeliveredResults | None = None,
    identity: Identity | None = None,
    repository: RepositoryService | None = None,
    rollouts: bool = True,
    rollout_interval_s: float = 1.0,
    local_db: str | None = None,
    rollout_store: Rollouts | None = None,
    leader: Callable[[], bool] | None = None,
    routing_store: RoutingRevisions | None = None,
    authority: Authority | None = None,
    cert_ttl_s: float = 86_400.0,
) -> FastAPI:
    """The registry app over ``store``. The caller owns ``store`` and closes it after the
    app has shut down. ``clock`` (epoch seconds) decides liveness; the expiry task runs
    every ``sweep_interval_s`` of real time while the app's lifespan is running.

    ``hard_examples`` and ``results``: where hard examples and the items nodes deliver
    (store-and-forward) go, owned by the caller -- on etcd, shared by every replica. When
    None and ``store`` is SQLite (or ``local_db`` names a SQLite file), the app opens a
    :class:`SqliteHardExampleStore` (capped at ``hard_example_max_rows``) or a
    :class:`ResultStore` (capped at ``result_max_rows``) on that file, and closes it when
    its lifespan ends.

    ``identity``: when given, calls are authenticated (see the module docstring); the caller
    owns it. None: an open registry (unit tests, a trusted loopback).

    ``repository``: the model repository (``/v1/blobs``, ``/v1/models``; see
    :mod:`tierlink.repo.routes`), owned by the caller; None: no repository routes.

    ``rollouts``: the app runs a :class:`RolloutController` (``app.state.rollouts``; None
    otherwise), stepped every ``rollout_interval_s`` of real time, over ``rollout_store``
    (the caller's) or, when ``store`` is SQLite, a
    :class:`~tierlink.control.rollouts.RolloutStore` on the same file (closed when its
    lifespan ends); only versions published in ``repository`` (when given) may be rolled
    out. ``leader``: whether this replica steps the rollouts now (None: always); the
    others tell nodes what the leader stored.

    ``routing_store``: the fleet's routing revisions (the caller's; on etcd, shared by the
    replicas); when None and ``store`` is SQLite, a store on the same file (closed when the
    lifespan ends). Nodes running another revision hear of the current one in their
    heartbeat answers (:mod:`tierlink.control.routing_revisions`).

    ``authority``: the fleet CA (with its key); enrolled nodes then get certificates from it
    (``POST /v1/certificate``, valid ``cert_ttl_s``; needs ``identity``)."""
    if ttl_s <= 0 or sweep_interval_s <= 0 or rollout_interval_s <= 0:
        raise ConfigError(
            f"ttl_s ({ttl_s}), sweep_interval_s ({sweep_interval_s}) and rollout_interval_s "
            f"({rollout_interval_s}) must be positive",
            hint="pass e.g. --ttl 5 (seconds a silent node stays listed)",
        )
    metrics = ControlMetrics.create()
    service = RegistryService(store, clock, float(ttl_s), metrics)
    owned: list[Callable[[], None]] = []  # closed when the lifespan ends
    if local_db is None and isinstance(store, SqliteRegistryStore):
        local_db = store.path
    if hard_examples is None and local_db is not None:
        hard_examples = SqliteHardExampleStore(local_db, max_rows=hard_example_max_rows)
        owned.append(hard_examples.close)
    examples = None if hard_examples is None else HardExampleService(hard_examples, clock,
                                                                      metrics)
    if rollouts and rollout_store is None and isinstance(store, SqliteRegistryStore):
        rollout_store = RolloutStore(store.path)
        owned.append(rollout_store.close)
    controller = None if not rollouts or rollout_store is None else RolloutController(
        rollout_store, service, clock, metrics.registry, repository, leader)
    if routing_store is None and local_db is not None:
        routing_store = SqliteRoutingRevisions(local_db)
        owned.append(routing_store.close)
    routing = None if routing_store is None else RoutingControl(routing_store, clock)
    if results is None and local_db is not None:  # store-and-forward (control/results.py)
        results = ResultStore(local_db, max_rows=result_max_rows, clock=clock)
        owned.append(results.close)
    fleet_view = FleetView(service.alive, clock, float(ttl_s),
                           rollouts=controller.records if controller is not None else list,
                           hard_examples=_counter(examples), routing=_revision(routing))
    lifespan = _lifespan(service, sweep_interval_s, controller, rollout_interval_s, owned,
                         fleet_view)
    app = FastAPI(title="tierlink control plane", version="1", lifespan=lifespan)
    app.state.registry = service
    app.state.hard_examples = examples
    app.state.identity = identity
    app.state.rollouts = controller
    app.state.fleet_view = fleet_view
    app.state.routing = routing
    _install_error_handlers(app)
    _install_timing(app, service.metrics)
    if identity is not None:
        install_auth(app, identity)
        install_identity_routes(app, identity, service)
        if authority is not None:
            from tierlink.control.certificates import install_certificate_routes

            install_certificate_routes(app, identity, authority, clock, cert_ttl_s)
    install_registry_routes(app, service, controller.desired_for if controller else None,
                            routing.for_node if routing else None)
    install_routing_routes(app, routing)
    _install_ops_routes(app, service, examples)
    install_hard_example_routes(app, examples)
    install_rollout_routes(app, controller)
    install_fleet_routes(app, fleet_view)
    if repository is not None:
        install_repository_routes(app, repository)
    if results is not None:
        # Hard examples delivered through nodes' outboxes go to their own store.
        handlers = {} if examples is None else {"hard_example": examples.add_delivered}
        install_result_routes(app, results, metrics=ResultMetrics(metrics.registry),
                              handlers=handlers)
    return app


def _revision(routing: RoutingControl | None) -> Callable[[], int | None]:
    def current() -> int | None:
        latest = routing.current() if routing is not None else None
        return latest.revision if latest is not None else None

    return current


def _counter(examples: HardExampleService | None) -> Callable[[], int | None]:
    return (lambda: None) if examples is None else examples.store.count


def _lifespan(service: RegistryService, sweep_interval_s: float,
              controller: RolloutController | None, rollout_interval_s: float,
              owned: list[Callable[[], None]], fleet_view: FleetView,
              ) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: the expiry sweep and the rollout tick run in the background;
    at shutdown they are cancelled (a running tick finishes first), then ``owned`` stores
    are closed."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(_sweep_forever(service, sweep_interval_s),
                                     name="tierlink-control-sweep")]
        if controller is not None:
            tasks.append(asyncio.create_task(_tick_forever(controller, rollout_interval_s),
                                             name="tierlink-control-rollouts"))
        tasks.append(asyncio.create_task(fleet_view.run(), name="tierlink-fleet-view"))
        app.state.sweep_task = tasks[0]  # for tests: done (cancelled) once shut down

        async def stopping() -> None:
            """The server stops accepting (the first step of its shutdown, before the
            lifespan ends): heartbeats can no longer arrive, so nothing may expire from
            here on -- nor may a watcher be answered a view emptied by that."""
            tasks[0].cancel()
            fleet_view.close()  # live fleet-view streams end
            watch = getattr(app.state, "view_watch", None)
            if watch is not None:
                watch.stop()
        app.state.stopping = stopping  # called by the server (control/server.py)
        try:
            yield
        finally:
            await stopping()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            watch = getattr(app.state, "view_watch", None)
            if watch is not None:
                await watch.close()
            for close in owned:
                close()
    return lifespan


def _install_ops_routes(app: FastAPI, service: RegistryService,
                        examples: HardExampleService | None) -> None:
    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "nodes": len(service.alive()[1])}

    @app.get("/metrics")
    def metrics() -> Response:
        service.update_gauges()
        if examples is not None:
            examples.update_gauges()
        return Response(generate_latest(service.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> Response:
        if any(e.get("loc", ("",))[0] in ("query", "path") for e in exc.errors()):
            message = format_error_list(exc.errors(), what=f"query of {request.url.path}",
                                        strip_first=True)
            return error_response(400, message, "invalid_request",
                                  "see GET /docs for the parameters and their ranges")
        if request.url.path.startswith("/v1/hard-examples"):  # a bad query parameter
            message = format_error_list(exc.errors(), what="hard-example query",
                                        strip_first=True)
            return error_response(400, message, "invalid_request", "see GET /docs for the parameters")
        if request.url.path.startswith("/v1/rollouts"):
            message = format_error_list(exc.errors(), what="rollout request",
                                        strip_first=True)
            return error_response(400, message, "invalid_request", _ROLLOUT_HINT)
        message = format_error_list(exc.errors(), what="heartbeat", strip_first=True)
        return error_response(422, message, "invalid_request", _HEARTBEAT_HINT)

    @app.exception_handler(TierlinkError)
    async def tierlink_error(_request: Request, exc: TierlinkError) -> Response:
        log.warning("control plane error: %s", exc)
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)


def _install_timing(app: FastAPI, metrics: ControlMetrics) -> None:
    """Every call's duration by method, route template and status: a plain ASGI
    middleware (Starlette's ``@app.middleware`` costs a task and a stream per call, which
    at thousands of heartbeats a second is most of a heartbeat's price)."""
    app.add_middleware(_Timing, metrics=metrics)


class _Timing:
    def __init__(self, app: Any, metrics: ControlMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()  # a duration, not a point in time: real clock on purpose
        status = [500]

        async def sent(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            route = scope.get("route")
            self.metrics.request_duration.labels(
                method=scope["method"],
                route=getattr(route, "path", "unmatched"),  # the template: bounded cardinality
                status=str(status[0]),
            ).observe(time.perf_counter() - start)


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


async def _tick_forever(controller: RolloutController, interval_s: float) -> None:
    """Step the rollouts every ``interval_s`` until cancelled; never dies on an error."""
    failing = False
    while True:
        await asyncio.sleep(interval_s)
        # Off the loop (SQLite, the registry's records); shielded so that a cancel at
        # shutdown waits for a running tick instead of closing the store under it.
        tick = asyncio.ensure_future(asyncio.to_thread(controller.tick))
        try:
            await asyncio.shield(tick)
        except asyncio.CancelledError:
            await asyncio.wait([tick])
            raise
        except Exception:
            if not failing:  # once per failure streak, not every second
                log.exception("rollout tick failed; retrying every %.1f s", interval_s)
            failing = True
        else:
            failing = False
