"""The control plane's HTTP API: the fleet registry.

    POST   /v1/nodes/{node_id}/heartbeat   a node's full state, about once a second
    GET    /v1/nodes                       alive nodes: {"nodes": [NodeRecord...], "ttl_s", "now"};
                                           ?splits=digest: each model's "splits" replaced by
                                           "splits_digest" (the nodes' own view: profiles are
                                           most of the bytes and rarely change)
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
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

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
from pydantic import ValidationError

from tierlink.control.identity import NODE, AdminRequired, Identity, authorize
from tierlink.control.results import DEFAULT_MAX_ROWS as DEFAULT_RESULT_ROWS
from tierlink.control.results import ResultMetrics, ResultStore, install_result_routes
from tierlink.control.rollout_routes import install_rollout_routes
from tierlink.control.rollouts import RolloutController, RolloutStore
from tierlink.control.schemas import (
    EnrollIn,
    HardExampleBatch,
    HardExampleIn,
    Heartbeat,
    NodeRecord,
    TokenIn,
    format_error_list,
    format_validation_error,
)
from tierlink.control.store import (
    AddResult,
    HardExampleStore,
    RegistryStore,
    SqliteHardExampleStore,
    SqliteRegistryStore,
    StoredExample,
)
from tierlink.errors import ConfigError, ControlPlaneError, InvalidRequest, TierlinkError
from tierlink.outbox import wire
from tierlink.repo.routes import install_repository_routes
from tierlink.repo.service import RepositoryService

log = logging.getLogger(__name__)

Clock = Callable[[], float]
TIERS = ("device", "edge", "cloud")
_HEARTBEAT_HINT = "send the fields of tierlink.control.schemas.Heartbeat as JSON"
_BATCH_HINT = ("send {\"examples\": [...]} with the fields of "
               "tierlink.control.schemas.HardExampleIn; input.data is base64 of the raw "
               "little-endian bytes of input.datatype and input.shape")
_EXAMPLE_HINT = ("the payload of a hard_example item has the fields of "
                 "tierlink.control.schemas.HardExampleIn (see HardExample.to_wire)")
_ROLLOUT_HINT = ("send {\"name\", \"version\", \"tier\"} and optional fields of "
                 "tierlink.control.schemas.RolloutIn as JSON")
MAX_BATCH_BODY_BYTES = 64 * 1024 * 1024
MAX_PAGE = 1000


@dataclass(frozen=True)
class ControlMetrics:
    """The control plane's Prometheus series, in a registry of their own (one per app)."""

    registry: CollectorRegistry
    nodes: Gauge
    heartbeats: Counter
    expired: Counter
    request_duration: Histogram
    hard_examples: Counter
    hard_examples_stored: Gauge

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
            hard_examples=Counter(
                "tierlink_control_hard_examples",
                "Hard examples received, by outcome: stored, duplicate (a retried batch), "
                "evicted (oldest, over the row cap), rejected (an invalid batch, or an "
                "invalid item delivered to /v1/results)", ["outcome"],
                registry=registry),
            hard_examples_stored=Gauge("tierlink_control_hard_examples_stored",
                                       "Hard examples in the store now", registry=registry),
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

    def alive_json(self, digests: bool = False) -> tuple[float, list[str]]:
        """:meth:`alive` as each record's JSON text (``GET /v1/nodes``); ``digests``:
        split profiles by digest."""
        now = self.clock()
        return now, self.store.alive_json(now, self.ttl_s, digests=digests)

    def split_profile(self, digest: str) -> str | None:
        """The JSON text of the split profile with this digest (``GET /v1/splits/...``)."""
        return self.store.split_profile(digest)

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


class HardExampleService:
    """The hard-example endpoints apart from HTTP: the store on the injected clock, metrics.
    Kept on ``app.state.hard_examples``."""

    def __init__(self, store: HardExampleStore, clock: Clock, metrics: ControlMetrics) -> None:
        self.store = store
        self.clock = clock
        self.metrics = metrics

    def add(self, body: bytes, caller_node: str | None = None) -> AddResult:
        """Validate and store one batch (``POST /v1/hard-examples``'s raw body).
        ``caller_node``: the authenticated node that posted it (None for an operator or an
        app without authentication); its batch may hold only its own examples, else the
        whole batch is refused (:class:`AdminRequired`, 403) and nothing is stored."""
        batch = _parse_batch(body, self.metrics)
        others = sorted({e.node_id for e in batch.examples} - {caller_node})
        if caller_node is not None and others:
            self.metrics.hard_examples.labels(outcome="rejected").inc(len(batch.examples))
            raise AdminRequired(f"node {caller_node!r} may not post hard examples of {others}",
                                hint="a node posts only its own hard examples (node_id = its id)")
        return self._store(batch.examples)

    def add_delivered(self, item: wire.WireItem, sender: str) -> bool:
        """Store one example a node delivered through its outbox: the ``hard_example``
        handler of ``POST /v1/results`` (:class:`~tierlink.control.results.ItemHandler`).
        True: stored now; False: already held (same node, request, model, row, created_at).
        Raises :class:`InvalidRequest` (answered ``rejected``) when the payload is not a
        :class:`HardExampleIn` or names another node than the item's origin."""
        example = _parse_example(item.payload, item.path(sender)[0], self.metrics)
        return self._store([example]).stored == 1

    def _store(self, examples: list[HardExampleIn]) -> AddResult:
        result = self.store.add(examples, self.clock())
        for outcome, n in (("stored", result.stored), ("duplicate", result.duplicates),
                           ("evicted", result.evicted)):
            self.metrics.hard_examples.labels(outcome=outcome).inc(n)
        if result.evicted:
            log.info("hard-example store at its cap: evicted the %d oldest", result.evicted)
        return result

    def update_gauges(self) -> None:
        self.metrics.hard_examples_stored.set(self.store.count())


def _parse_batch(body: bytes, metrics: ControlMetrics) -> HardExampleBatch:
    try:
        if len(body) > MAX_BATCH_BODY_BYTES:
            raise InvalidRequest(f"hard-example batch of {len(body)} bytes is larger than the "
                                 f"{MAX_BATCH_BODY_BYTES} allowed", hint="send smaller batches")
        try:
            return HardExampleBatch.model_validate(json.loads(body))
        except ValueError as exc:  # ValidationError is a ValueError too
            raise _invalid_batch(exc) from None
    except InvalidRequest:
        metrics.hard_examples.labels(outcome="rejected").inc()
        raise


def _parse_example(payload: Any, origin: str, metrics: ControlMetrics) -> HardExampleIn:
    try:
        try:
            example = HardExampleIn.model_validate(payload)
        except ValidationError as exc:
            raise InvalidRequest(format_validation_error(exc, what="hard example"),
                                 hint=_EXAMPLE_HINT) from None
        if example.node_id != origin:
            raise InvalidRequest(f"invalid hard example: node_id is {example.node_id!r} but "
                                 f"the item comes from {origin!r}",
                                 hint="a node delivers only its own hard examples")
    except InvalidRequest:
        metrics.hard_examples.labels(outcome="rejected").inc()
        raise
    return example


def _invalid_batch(exc: ValueError) -> InvalidRequest:
    if isinstance(exc, ValidationError):
        message = format_validation_error(exc, what="hard-example batch")
    else:
        message = f"invalid hard-example batch: the body is not JSON: {exc}"
    return InvalidRequest(message, hint=_BATCH_HINT)


def create_app(
    store: RegistryStore,
    clock: Clock = time.time,
    ttl_s: float = 5.0,
    *,
    sweep_interval_s: float = 1.0,
    hard_examples: HardExampleStore | None = None,
    hard_example_max_rows: int = 50_000,
    result_max_rows: int = DEFAULT_RESULT_ROWS,
    identity: Identity | None = None,
    repository: RepositoryService | None = None,
    rollouts: bool = True,
    rollout_interval_s: float = 1.0,
    local_db: str | None = None,
) -> FastAPI:
    """The registry app over ``store``. The caller owns ``store`` and closes it after the
    app has shut down. ``clock`` (epoch seconds) decides liveness; the expiry task runs
    every ``sweep_interval_s`` of real time while the app's lifespan is running.

    ``hard_examples``: where hard examples go (owned by the caller). When None and ``store``
    is SQLite (or ``local_db`` names a SQLite file), the app opens a
    :class:`SqliteHardExampleStore` on that file, capped at ``hard_example_max_rows``, and
    closes it when its lifespan ends; likewise the result store of store-and-forward
    (:class:`ResultStore`), capped at ``result_max_rows``. A replica over etcd keeps these
    two in its ``local_db``: each replica holds what was delivered to it.

    ``identity``: when given, calls are authenticated (see the module docstring); the caller
    owns it. None: an open registry (unit tests, a trusted loopback).

    ``repository``: the model repository (``/v1/blobs``, ``/v1/models``; see
    :mod:`tierlink.repo.routes`), owned by the caller; None: no repository routes.

    ``rollouts``: when ``store`` is SQLite, the app opens a
    :class:`~tierlink.control.rollouts.RolloutStore` on the same file (closed when its
    lifespan ends) and runs a :class:`RolloutController` (``app.state.rollouts``; None
    otherwise), stepped every ``rollout_interval_s`` of real time; only versions published
    in ``repository`` (when given) may be rolled out."""
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
    controller = None
    if rollouts and isinstance(store, SqliteRegistryStore):
        controller = RolloutController(RolloutStore(store.path), service, clock,
                                       metrics.registry, repository)
        owned.append(controller.store.close)
    results = None
    if local_db is not None:  # store-and-forward results (control/results.py)
        results = ResultStore(local_db, max_rows=result_max_rows, clock=clock)
        owned.append(results.close)
    lifespan = _lifespan(service, sweep_interval_s, controller, rollout_interval_s, owned)
    app = FastAPI(title="tierlink control plane", version="1", lifespan=lifespan)
    app.state.registry = service
    app.state.hard_examples = examples
    app.state.identity = identity
    app.state.rollouts = controller
    _install_error_handlers(app)
    _install_timing(app, service.metrics)
    if identity is not None:
        _install_auth(app, identity)
        _install_identity_routes(app, identity, service)
    _install_routes(app, service, examples, controller)
    _install_hard_example_routes(app, examples)
    install_rollout_routes(app, controller)
    if repository is not None:
        install_repository_routes(app, repository)
    if results is not None:
        # Hard examples delivered through nodes' outboxes go to their own store.
        handlers = {} if examples is None else {"hard_example": examples.add_delivered}
        install_result_routes(app, results, metrics=ResultMetrics(metrics.registry),
                              handlers=handlers)
    return app


def _lifespan(service: RegistryService, sweep_interval_s: float,
              controller: RolloutController | None, rollout_interval_s: float,
              owned: list[Callable[[], None]]
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
        app.state.sweep_task = tasks[0]  # for tests: done (cancelled) once shut down
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for close in owned:
                close()
    return lifespan


def _install_auth(app: FastAPI, identity: Identity) -> None:
    @app.middleware("http")
    async def authenticated(request: Request, call_next: Callable[[Request], Awaitable[Response]]
                            ) -> Response:
        try:
            request.state.caller = await asyncio.to_thread(
                authorize, identity, request.method, request.url.path,
                request.headers.get("authorization"))
        except TierlinkError as exc:
            return JSONResponse(exc.to_dict(), status_code=exc.http_status)
        return await call_next(request)


def _install_identity_routes(app: FastAPI, identity: Identity,
                             service: RegistryService) -> None:
    @app.post("/v1/enroll")
    def enroll(body: EnrollIn) -> dict[str, Any]:
        secret = identity.enroll(body.token, body.node_id, body.tier, service.clock())
        log.info("node %s (%s) enrolled", body.node_id, body.tier)
        return {"node_id": body.node_id, "secret": secret}

    @app.post("/v1/enrollment-tokens", status_code=201)
    def create_token(body: TokenIn) -> dict[str, Any]:
        token = identity.create_token(service.clock(), ttl_s=body.ttl_s, uses=body.uses,
                                      note=body.note)
        return {"token": token, "ttl_s": body.ttl_s, "uses": body.uses, "note": body.note}

    @app.get("/v1/credentials")
    def credentials() -> dict[str, Any]:
        return {"nodes": [{"node_id": c.node_id, "tier": c.tier, "enrolled_at": c.enrolled_at,
                           "revoked_at": c.revoked_at} for c in identity.credentials()]}

    @app.post("/v1/credentials/{node_id}/revoke")
    def revoke(node_id: str) -> Any:
        if not identity.revoke(node_id, service.clock()):
            return _error(404, f"node {node_id!r} is not enrolled or already revoked",
                          "node_not_found", "list them with GET /v1/credentials")
        service.deregister(node_id)  # nobody routes to it any more
        log.warning("node %s revoked", node_id)
        return {"node_id": node_id, "revoked": True}


def _install_routes(app: FastAPI, service: RegistryService,
                    examples: HardExampleService | None,
                    rollouts: RolloutController | None) -> None:
    @app.post("/v1/nodes/{node_id}/heartbeat")
    def heartbeat(node_id: str, body: Heartbeat) -> Any:
        if body.node_id != node_id:
            return _error(422, f"invalid heartbeat: node_id: {body.node_id!r} does not match "
                          f"the path's node id {node_id!r}", "invalid_request",
                          "post to /v1/nodes/{the body's node_id}/heartbeat")
        record = service.heartbeat(body)
        desired = rollouts.desired_for(node_id) if rollouts is not None else {}
        return {"node_id": record.node_id, "generation": record.generation,
                "registered_at": record.registered_at, "ttl_s": service.ttl_s,
                "desired": desired, "draining": record.draining}

    @app.post("/v1/nodes/{node_id}/drain")
    def drain(node_id: str) -> Any:
        return _drained(node_id, True)

    @app.delete("/v1/nodes/{node_id}/drain")
    def undrain(node_id: str) -> Any:
        return _drained(node_id, False)

    def _drained(node_id: str, draining: bool) -> Any:
        if draining and service.get(node_id) is None:
            return _unknown(node_id)
        changed = service.store.drain(node_id, draining)
        if changed:
            log.warning("node %s %s", node_id, "drained" if draining else "undrained")
        return {"node_id": node_id, "draining": draining, "changed": changed}

    @app.get("/v1/nodes")
    def nodes(splits: Literal["full", "digest"] = "full") -> Response:
        # The stored heartbeat texts, spliced: every node reads this every second, so its
        # cost grows with the square of the fleet; nothing is decoded or encoded again.
        # splits=digest: profiles (most of a record's bytes) by digest, fetched once each.
        now, records = service.alive_json(digests=splits == "digest")
        tail = json.dumps({"ttl_s": service.ttl_s, "now": now})[1:]
        return Response(('{"nodes":[' + ",".join(records) + "]," + tail).encode(),
                        media_type="application/json")

    @app.get("/v1/splits/{digest}")
    def split_profile(digest: str) -> Response:
        text = service.split_profile(digest)
        if text is None:
            return _error(404, f"no alive node reports a split profile with digest {digest!r}",
                          "split_profile_not_found", "fetch GET /v1/nodes?splits=digest again")
        return Response(f'{{"digest":{json.dumps(digest)},"splits":{text}}}'.encode(),
                        media_type="application/json")

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
        if examples is not None:
            examples.update_gauges()
        return Response(generate_latest(service.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)


def _install_hard_example_routes(app: FastAPI, examples: HardExampleService | None) -> None:
    def need() -> HardExampleService:
        if examples is None:
            raise ControlPlaneError("this control plane keeps no hard-example store",
                                    hint="run `tierlink control` with a SQLite --db")
        return examples

    @app.post("/v1/hard-examples")
    async def post_examples(request: Request) -> dict[str, int]:
        body = await request.body()  # raw: validated by HardExampleBatch, 400 when bad
        caller = getattr(request.state, "caller", None)
        node = caller.node_id if caller is not None and caller.kind == NODE else None
        result = await asyncio.to_thread(need().add, body, node)  # decode + SQLite off the loop
        return {"stored": result.stored, "duplicates": result.duplicates,
                "evicted": result.evicted}

    # Plain `def` handlers: FastAPI runs them on a worker thread, off the event loop.
    @app.get("/v1/hard-examples")
    def list_examples(model: str | None = None, node: str | None = None, after_id: int = 0,
                      limit: int = 100) -> dict[str, Any]:
        limit = _page_size(limit)
        records = need().store.page(model=model, node=node, after_id=after_id, limit=limit)
        return {"examples": [r.model_dump(mode="json") for r in records],
                "next_after_id": records[-1].id if len(records) == limit else None}

    @app.get("/v1/hard-examples/export")
    def export_examples(model: str | None = None, node: str | None = None,
                        limit: int | None = None) -> Response:
        rows = need().store.export(model=model, node=node, limit=limit)
        return Response(to_npz(rows), media_type="application/octet-stream", headers={
            "Content-Disposition": 'attachment; filename="hard-examples.npz"',
            "X-Tierlink-Examples": str(len(rows))})


def _page_size(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be in 1..{MAX_PAGE}, got {limit}",
                             hint="page with after_id=<the last id you got>")
    return limit


def to_npz(rows: list[StoredExample]) -> bytes:
    """The exported examples as ``.npz`` bytes (``numpy.load`` reads them without pickle):
    ``inputs`` (N, *shape), ``labels`` (N,) int64 (-1: unknown), ``predictions`` (N,) int64,
    ``confidences`` (N,) float32, ``ids`` (N,) int64, ``created_at`` (N,) float64 and the
    strings ``models``, ``nodes``, ``privacy``, ``request_ids`` (N,). Every input must have
    the same datatype and shape (filter by ``model`` otherwise)."""
    import numpy as np

    from tierlink.transport.oip import numpy_dtype

    kinds = {(r.record.datatype, tuple(r.record.shape)) for r in rows}
    if len(kinds) > 1:
        raise InvalidRequest(f"the selected hard examples have {len(kinds)} different input "
                             f"types/shapes ({sorted(kinds)[:3]}...); cannot stack them",
                             hint="export one model at a time: ?model=NAME")
    datatype, shape = next(iter(kinds), ("FP32", ()))
    inputs = np.stack([np.frombuffer(r.data, numpy_dtype(datatype)).reshape(shape)
                       for r in rows]) if rows else np.zeros((0,), np.float32)
    column = [r.record for r in rows]
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer, inputs=inputs,
        labels=np.array([r.label for r in column], np.int64),
        predictions=np.array([r.prediction for r in column], np.int64),
        confidences=np.array([r.confidence for r in column], np.float32),
        ids=np.array([r.id for r in column], np.int64),
        created_at=np.array([r.created_at for r in column], np.float64),
        models=np.array([r.model for r in column], np.str_),
        nodes=np.array([r.node_id for r in column], np.str_),
        privacy=np.array([r.privacy for r in column], np.str_),
        request_ids=np.array([r.request_id for r in column], np.str_))
    return buffer.getvalue()


def _unknown(node_id: str) -> Response:
    return _error(404, f"node {node_id!r} is not registered (unknown, expired or deregistered)",
                  "node_not_found", "list the alive nodes with GET /v1/nodes")


def _error(status: int, message: str, code: str, hint: str) -> Response:
    return JSONResponse({"error": message, "code": code, "hint": hint}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> Response:
        if request.url.path.startswith("/v1/hard-examples"):  # a bad query parameter
            message = format_error_list(exc.errors(), what="hard-example query",
                                        strip_first=True)
            return _error(400, message, "invalid_request", "see GET /docs for the parameters")
        if request.url.path.startswith("/v1/rollouts"):
            message = format_error_list(exc.errors(), what="rollout request",
                                        strip_first=True)
            return _error(400, message, "invalid_request", _ROLLOUT_HINT)
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
