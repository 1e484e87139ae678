"""The control plane's end of store-and-forward: results of asynchronous requests (and any
other item kind nodes deliver to it), stored once per idempotency key; kinds with a handler
(``hard_example``: the hard-example store) are handed to it instead, once per key too.

    POST /v1/results           a node's batch (tierlink.outbox.wire), answered per item:
                               200 {"acks": [{"key", "status": ok|duplicate|rejected}]};
                               400 for a batch that cannot be read (nothing stored)
    GET  /v1/results/{key}     one stored item; 404 ``result_not_found`` when it has not
                               arrived (yet) or is unknown
    GET  /v1/results           stored items in arrival order: ?after=<seq>&limit=<1..1000>
                               -> {"results": [...], "next_after": seq | null}

A stored item: ``{"seq", "key", "kind", "origin", "chain", "sender", "payload",
"created_at", "received_at"}`` — ``chain`` is every node it passed through (origin first,
``sender`` last), ``created_at`` the origin's time, ``received_at`` the control plane's.
Stored items are kept ``retention_s`` (seven days by default: the time a client has to
fetch a result) and at most ``max_rows`` of them (the latest arrivals; older ones are
evicted as new ones come), so the control plane's disk is bounded; evictions are counted
in ``tierlink_control_results_total{outcome="evicted"}``.

Exactly once: the key is recorded by an :class:`~tierlink.outbox.Inbox` on the *same*
SQLite file, in the same transaction as the row (:meth:`Inbox.record`), committed with
``synchronous=FULL`` before the answer: a crash leaves both or neither, and a replay is
answered ``duplicate`` and stored once. Counted in
``tierlink_control_results_total{outcome=stored|duplicate|rejected}``.

Handed-off kinds (:class:`ItemHandler`, given to :func:`install_result_routes` by kind, so
this module knows nothing of what they do) are not stored here (``GET /v1/results/{key}``
does not know them): each new key is passed to its kind's handler, then recorded
(:meth:`Inbox.apply`: the handler's effect lives in another table, with its own
transaction). A crash between the two leaves the key unrecorded and the redelivered item is
handed over again, so a handler must recognise an item it already holds by its content
(and answer False: ``duplicate``). The key is recorded with ``synchronous=FULL`` before the
answer, which also syncs the handler's earlier commit when its store is in the same database
file (one WAL), as the control plane's hard-example store is. A handler's :class:`~tierlink.errors.InvalidRequest` is answered ``rejected`` for that item
alone (nothing recorded: a replay is rejected again).

When the app authenticates callers (``request.state.caller``), a node may post only batches
``from`` itself (403 otherwise); operators may post for any node.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

# The web adapter: importing it means serving, so fastapi is imported here.
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from tierlink.control.identity import NODE, AdminRequired
from tierlink.errors import ConfigError, ControlPlaneError, InvalidRequest, TierlinkError
from tierlink.outbox import Ack, AckStatus, Inbox, wire
from tierlink.outbox.inbox import DEFAULT_RETENTION_S
from tierlink.sqlite_store import mapped_errors, write_transaction
from tierlink.transport.openapi import request_body

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("tierlink.control.results")

MAX_BODY_BYTES = 64 * 2**20
MAX_PAGE = 1000
PRUNE_EVERY_S = 3600.0
DEFAULT_MAX_ROWS = 200_000
OUTCOMES = ("stored", "duplicate", "rejected", "evicted")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS async_results (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,  -- arrival order, for paging
        key         TEXT NOT NULL UNIQUE,               -- the idempotency key
        kind        TEXT NOT NULL,
        origin      TEXT NOT NULL,                      -- chain[0]
        chain       TEXT NOT NULL,                      -- JSON list, origin first
        sender      TEXT NOT NULL,                      -- the node that delivered it here
        payload     TEXT NOT NULL,                      -- JSON
        created_at  REAL NOT NULL,                      -- at the origin, epoch s
        received_at REAL NOT NULL
    )""",
)
_COLUMNS = "seq, key, kind, origin, chain, sender, payload, created_at, received_at"
# What the inbox remembers of a handed-off key: the handler applied it, or held it already.
_APPLIED, _HELD = b"handed", b"held"


@dataclass(frozen=True, slots=True)
class StoredResult:
    seq: int
    key: str
    kind: str
    origin: str
    chain: tuple[str, ...]
    sender: str
    payload: Any
    created_at: float
    received_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "key": self.key, "kind": self.kind, "origin": self.origin,
                "chain": list(self.chain), "sender": self.sender, "payload": self.payload,
                "created_at": self.created_at, "received_at": self.received_at}


class ItemHandler(Protocol):
    """Applies delivered items of one kind somewhere other than ``async_results``.

    Called by :meth:`ResultStore.add` on a worker thread (it may block on its own store),
    once per new idempotency key — and once more for a key whose first hand-off was cut by a
    crash (see the module doc). ``sender`` is the node that posted the batch;
    ``item.path(sender)[0]`` is the item's origin. Returns True when the item was applied
    now, False when the handler already held it (answered ``duplicate``). Raises
    :class:`~tierlink.errors.InvalidRequest` for an item it can never accept (answered
    ``rejected``); any other :class:`~tierlink.errors.TierlinkError` fails the batch (503,
    the sender retries it)."""

    def __call__(self, item: wire.WireItem, sender: str, /) -> bool: ...


Handlers = Mapping[str, ItemHandler]  # by item kind


class DeliveredResults(Protocol):
    """Where delivered items are kept: :class:`ResultStore` (SQLite, one control plane) or
    :class:`~tierlink.control.etcd_results.EtcdResultStore` (replicas sharing etcd)."""

    def add(self, batch: wire.Batch, handlers: Handlers | None = None) -> list[Ack]: ...

    def get(self, key: str) -> StoredResult | None: ...

    def page(self, after: int = 0, limit: int = 100) -> list[StoredResult]: ...

    def count(self) -> int: ...

    def take_evicted(self) -> int: ...

    def close(self) -> None: ...


class ResultStore:
    """Delivered items in SQLite (WAL), each key once (see the module doc). Thread-safe.
    ``path`` may be the control plane's own database file (one table and the inbox's)."""

    def __init__(self, path: str | Path, *, retention_s: float = DEFAULT_RETENTION_S,
                 max_rows: int = DEFAULT_MAX_ROWS,
                 clock: Callable[[], float] = time.time) -> None:
        if max_rows < 1 or not retention_s > 0:
            raise ConfigError(f"the result store needs max_rows >= 1 and retention_s > 0, got "
                              f"{max_rows} and {retention_s}")
        self.path = str(path)
        self.retention_s = float(retention_s)
        self.max_rows = int(max_rows)
        self._clock = clock
        self._evicted = 0  # since the last take_evicted()
        self._inbox = Inbox(self.path, retention_s=retention_s, clock=clock)
        self._lock = threading.Lock()
        self._last_prune = float("-inf")
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None,
                                         check_same_thread=False)  # serialised by the lock
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA busy_timeout=5000")
            for statement in _SCHEMA:
                self._conn.execute(statement)
        except sqlite3.Error as exc:
            self._inbox.close()
            raise ControlPlaneError(f"cannot open the result store {self.path}: {exc}",
                                    hint="check the --db path and its permissions") from exc

    def add(self, batch: wire.Batch, handlers: Handlers | None = None) -> list[Ack]:
        """Apply a batch's new items; acks in item order. Items of a kind in ``handlers`` are
        handed to it, one key at a time (see :class:`ItemHandler`); the others are stored
        here, in one transaction. Raises :class:`ControlPlaneError` or
        :class:`~tierlink.errors.OutboxError` (503: the sender retries; what was applied
        is answered ``duplicate`` then) when the disk fails."""
        handlers = handlers or {}
        now = self._clock()
        handed = {i: e for i, e in enumerate(batch.entries)
                  if isinstance(e, wire.WireItem) and e.kind in handlers}
        acks: dict[int, Ack] = {}
        if len(handed) < len(batch.entries):
            with self._lock, self._transaction():
                for i, entry in enumerate(batch.entries):
                    if i not in handed:
                        acks[i] = self._ack(batch.sender, entry, now)
                self._evict_over_cap()
        for i, item in handed.items():  # outside the transaction: handlers write elsewhere
            acks[i] = self._hand_off(batch.sender, item, handlers[item.kind])
        self._maybe_prune(now)
        return [acks[i] for i in range(len(batch.entries))]

    def get(self, key: str) -> StoredResult | None:
        with self._lock, self._guard("read a result"):
            row = self._conn.execute(f"SELECT {_COLUMNS} FROM async_results WHERE key = ?",
                                     (key,)).fetchone()
        return None if row is None else _stored(row)

    def page(self, after: int = 0, limit: int = 100) -> list[StoredResult]:
        """Up to ``limit`` items with ``seq > after``, in arrival order."""
        with self._lock, self._guard("read results"):
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM async_results WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, limit)).fetchall()
        return [_stored(row) for row in rows]

    def count(self) -> int:
        with self._lock, self._guard("count results"):
            (n,) = self._conn.execute("SELECT COUNT(*) FROM async_results").fetchone()
        return int(n)

    def take_evicted(self) -> int:
        """Items evicted (over the row cap or past the retention) since the last call."""
        with self._lock:
            n, self._evicted = self._evicted, 0
        return n

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self._inbox.close()

    def _ack(self, sender: str, entry: wire.WireItem | wire.Rejected, now: float) -> Ack:
        """Store one entry inside the open transaction; its ack."""
        if isinstance(entry, wire.Rejected):
            return Ack(entry.key, AckStatus.REJECTED, entry.detail)
        if self._store(sender, entry, now):
            return Ack(entry.key, AckStatus.OK)
        return Ack(entry.key, AckStatus.DUPLICATE)

    def _hand_off(self, sender: str, item: wire.WireItem, handler: ItemHandler) -> Ack:
        """Pass a new key to ``handler``, then record it; a recorded key is a duplicate."""
        def effect() -> bytes:
            return _APPLIED if handler(item, sender) else _HELD

        try:
            answer, repeat = self._inbox.apply(item.key, effect)
        except InvalidRequest as exc:
            return Ack(item.key, AckStatus.REJECTED, exc.message)
        new = not repeat and answer == _APPLIED
        return Ack(item.key, AckStatus.OK if new else AckStatus.DUPLICATE)

    def _store(self, sender: str, item: wire.WireItem, now: float) -> bool:
        """True when ``item`` is new (stored now); inside the open transaction."""
        if not self._inbox.record(item.key, self._conn, b"stored"):
            return False
        chain = item.path(sender)
        # OR IGNORE: a key pruned from the inbox (older than its retention) whose row is
        # still here is a duplicate too.
        cur = self._conn.execute(
            "INSERT OR IGNORE INTO async_results (key, kind, origin, chain, sender, payload, "
            "created_at, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (item.key, item.kind, chain[0], json.dumps(chain), sender,
             json.dumps(item.payload, separators=(",", ":")), item.created_at, now))
        return cur.rowcount == 1

    def _evict_over_cap(self) -> None:
        """Inside the open transaction: drop the oldest arrivals beyond ``max_rows`` (by
        ``seq``, the primary key: no count of the table)."""
        cur = self._conn.execute(
            "DELETE FROM async_results WHERE seq <= (SELECT MAX(seq) FROM async_results) - ?",
            (self.max_rows,))
        self._note_evicted(cur.rowcount, f"over the cap of {self.max_rows}")

    def _maybe_prune(self, now: float) -> None:
        """Now and then: forget old inbox keys (record-only inboxes do not prune alone) and
        drop stored items past the retention."""
        if now - self._last_prune < PRUNE_EVERY_S:
            return
        self._last_prune = now
        self._inbox.prune(now)
        with self._lock, self._transaction():
            cur = self._conn.execute("DELETE FROM async_results WHERE received_at < ?",
                                     (now - self.retention_s,))
            self._note_evicted(cur.rowcount, f"older than {self.retention_s:g} s")

    def _note_evicted(self, n: int, why: str) -> None:
        if n > 0:
            self._evicted += n
            log.info("result store: evicted %d stored item(s) %s", n, why)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        # Durable (synchronous=FULL) before the answer.
        with self._guard("store results"), write_transaction(self._conn, "FULL"):
            yield

    def _guard(self, action: str) -> AbstractContextManager[None]:
        return mapped_errors(lambda message: ControlPlaneError(
            message, hint="is the control plane's disk full or failing?"),
            f"result store {self.path}: could not {action}")


def _stored(row: tuple[Any, ...]) -> StoredResult:
    seq, key, kind, origin, chain, sender, payload, created_at, received_at = row
    return StoredResult(int(seq), str(key), str(kind), str(origin), tuple(json.loads(chain)),
                        str(sender), json.loads(payload), float(created_at), float(received_at))


class ResultMetrics:
    """``tierlink_control_results_total{outcome}`` and ``tierlink_control_results_stored``
    in ``registry`` (the control app's: ``app.state.registry.metrics.registry``; None: a
    registry of its own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = registry if registry is not None else CollectorRegistry()
        self.results = Counter(
            "tierlink_control_results_total",
            "Delivered items (async results, ...) by outcome: stored, duplicate (a replay, "
            "stored once), rejected (an item or a whole batch that could not be read), "
            "evicted (a stored item dropped: over the row cap or past the retention)",
            ["outcome"], registry=self.registry)
        self.stored = Gauge("tierlink_control_results_stored", "Delivered items stored now",
                            registry=self.registry)
        for outcome in OUTCOMES:
            self.results.labels(outcome)

    def count(self, acks: Sequence[Ack]) -> None:
        for outcome, status in (("stored", AckStatus.OK), ("duplicate", AckStatus.DUPLICATE),
                                ("rejected", AckStatus.REJECTED)):
            n = sum(1 for a in acks if a.status is status)
            if n:
                self.results.labels(outcome).inc(n)


def install_result_routes(app: FastAPI, store: DeliveredResults, *,
                          metrics: ResultMetrics | None = None,
                          handlers: Handlers | None = None) -> None:
    """Add the routes of the module doc to ``app`` (the caller owns and closes ``store``);
    keeps ``store`` on ``app.state.results``. ``handlers``: item kinds applied elsewhere
    (e.g. ``{"hard_example": ...}``, see :class:`ItemHandler`); raises
    :class:`ConfigError` for a name that is not an item kind. Errors are answered here as
    ``{"error", "code", "hint"}`` JSON, so the routes need no handler of the app's."""
    handlers = _checked(handlers or {})
    metrics = metrics or ResultMetrics()
    metrics.stored.set_function(lambda: float(store.count()))
    app.state.results = store

    @app.post("/v1/results", openapi_extra=request_body(wire.BATCH_SCHEMA))
    async def post_results(request: Request) -> Response:
        return await _answer(lambda: _receive(request, store, metrics, handlers))

    @app.get("/v1/results")
    async def list_results(request: Request) -> Response:
        return await _answer(lambda: _page(request, store))

    @app.get("/v1/results/{key:path}")
    async def get_result(key: str) -> Response:
        return await _answer(lambda: _one(key, store))


def _checked(handlers: Handlers) -> dict[str, ItemHandler]:
    for kind in handlers:
        if not wire.KIND_PATTERN.fullmatch(kind):
            raise ConfigError(f"result handler for {kind!r}: not an item kind",
                              hint="name a kind like 'hard_example' (lower-case letters, "
                                   "digits, _ . -)")
    return dict(handlers)  # a copy: later changes to the caller's mapping do not leak in


async def _answer(handle: Callable[[], Awaitable[Response]]) -> Response:
    try:
        return await handle()
    except TierlinkError as exc:
        log.warning("results: %s", exc)
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)


async def _receive(request: Request, store: DeliveredResults, metrics: ResultMetrics,
                   handlers: Handlers) -> Response:
    body = await request.body()
    try:
        if len(body) > MAX_BODY_BYTES:
            raise InvalidRequest(f"invalid outbox batch: {len(body)} bytes, more than the "
                                 f"{MAX_BODY_BYTES} allowed", hint="send smaller batches")
        batch = wire.parse_batch(body)
    except InvalidRequest:
        metrics.results.labels("rejected").inc()
        raise
    _check_sender(request, batch.sender)
    acks = await asyncio.to_thread(store.add, batch, handlers)  # fsync: off the event loop
    metrics.count(acks)
    metrics.results.labels("evicted").inc(store.take_evicted())
    return JSONResponse(wire.encode_acks(acks))


def _check_sender(request: Request, sender: str) -> None:
    caller = getattr(request.state, "caller", None)
    if caller is not None and caller.kind == NODE and caller.node_id != sender:
        raise AdminRequired(f"node {caller.node_id!r} may not deliver a batch from "
                            f"{sender!r}", hint="a node posts its own outbox: from = its id")


async def _page(request: Request, store: DeliveredResults) -> Response:
    # Read by hand, not as typed parameters: a bad value is a 400 naming it, whatever
    # validation handler the app has.
    after = _int_param(request, "after", 0, 0, None)
    limit = _int_param(request, "limit", 100, 1, MAX_PAGE)
    rows = await asyncio.to_thread(store.page, after, limit)
    return JSONResponse({"results": [r.to_dict() for r in rows],
                         "next_after": rows[-1].seq if len(rows) == limit else None})


async def _one(key: str, store: DeliveredResults) -> Response:
    stored = await asyncio.to_thread(store.get, key)
    if stored is None:
        return JSONResponse(
            {"error": f"no result with key {key!r} has arrived (yet)", "code": "result_not_found",
             "hint": "results arrive through the node's outbox: retry later; the key is the "
                     "'result_key' of the 202 answer (<node id>:<request id>)"},
            status_code=404)
    return JSONResponse(stored.to_dict())


def _int_param(request: Request, name: str, default: int, low: int, high: int | None) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise InvalidRequest(f"{name} must be an integer {bound}, got {raw!r}",
                             hint="page with after=<next_after of the previous page>")
    return value


__all__ = ["DeliveredResults", "Handlers", "ItemHandler", "ResultMetrics", "ResultStore",
           "StoredResult", "install_result_routes"]
