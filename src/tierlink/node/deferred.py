"""A node's asynchronous requests: answered now, or held for a cheaper price window.

A ``tierlink.async`` request is routed at once and its result queued in the node's outbox
(:mod:`tierlink.node.async_requests`) — unless its deadline reaches a window of lower prices
(``cost.schedule``) in which its policy would plan it for less
(:func:`tierlink.routing.deferral.deferral`). Then the request itself (its task, parameters
and inputs) is written to ``state_dir/deferred.sqlite`` — fsynced before the caller is
answered ``202 {"status": "deferred", "run_after", "result_key"}`` — and run when its time
comes, with what is left of its deadline; its result then travels as any asynchronous
result. A node that restarts runs what it held. A deferred request that fails when it runs
(nothing can place it) is not dropped: its error is the result queued.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import Outcome
from tierlink.errors import InvalidRequest, OutboxError, TierlinkError
from tierlink.node import protocol
from tierlink.node.async_requests import AsyncResults, result_key
from tierlink.routing.deferral import Deferral
from tierlink.sqlite_store import open_store, write_transaction

log = logging.getLogger(__name__)

Route = Callable[[str, dict[str, np.ndarray], dict[str, Any], str],
                 Awaitable[tuple[dict[str, np.ndarray], Outcome, float]]]
Decide = Callable[[str, dict[str, np.ndarray], dict[str, Any], str], Deferral]
POLL_S = 1.0
PARALLEL = 16  # held requests run at once, at most (their work queues at batch priority)

_SCHEMA = ("""CREATE TABLE IF NOT EXISTS deferred (
    request_id TEXT PRIMARY KEY, task TEXT NOT NULL, params TEXT NOT NULL,
    inputs BLOB NOT NULL, run_at REAL NOT NULL, deadline_at REAL NOT NULL)""",
           "CREATE INDEX IF NOT EXISTS deferred_run_at ON deferred (run_at)")


@dataclass(frozen=True, slots=True)
class Held:
    """A deferred request as it waits: when to run it (wall time) and its deadline."""

    request_id: str
    task: str
    params: dict[str, Any]
    inputs: dict[str, np.ndarray]
    run_at: float
    deadline_at: float


class DeferredStore:
    """Deferred requests on disk (SQLite, each put committed with ``synchronous=FULL``)."""

    def __init__(self, path: Path) -> None:
        self._conn = open_store(str(path), _SCHEMA, OutboxError, "deferred requests")
        self._lock = threading.Lock()

    def put(self, held: Held) -> None:
        buf = io.BytesIO()
        np.savez(buf, **held.inputs)  # type: ignore[arg-type]
        with self._lock, write_transaction(self._conn):
            self._conn.execute(
                "INSERT OR IGNORE INTO deferred VALUES (?, ?, ?, ?, ?, ?)",
                (held.request_id, held.task, json.dumps(held.params), buf.getvalue(),
                 held.run_at, held.deadline_at))

    def due(self, now: float) -> list[Held]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT request_id, task, params, inputs, run_at, deadline_at FROM deferred "
                "WHERE run_at <= ? ORDER BY run_at", (now,)).fetchall()
        return [Held(r[0], r[1], json.loads(r[2]), _arrays(r[3]), r[4], r[5]) for r in rows]

    def remove(self, request_id: str) -> None:
        with self._lock, write_transaction(self._conn, "NORMAL"):
            self._conn.execute("DELETE FROM deferred WHERE request_id = ?", (request_id,))

    def __len__(self) -> int:
        with self._lock:
            (n,) = self._conn.execute("SELECT COUNT(*) FROM deferred").fetchone()
        return int(n)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _arrays(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob)) as z:
        return {k: z[k] for k in z.files}


class AsyncDesk:
    """Accepts asynchronous requests: routed now, or held in ``store`` until the time
    ``decide`` gives (``wall``: epoch seconds); :meth:`run_due` runs the held ones."""

    def __init__(self, results: AsyncResults, store: DeferredStore | None, route: Route,
                 decide: Decide, wall: Callable[[], float] = time.time) -> None:
        self.results, self.store = results, store
        self._route, self._decide, self._wall = route, decide, wall

    async def accept(self, task: str, inputs: dict[str, np.ndarray], params: dict[str, Any],
                     request_id: str | None) -> dict[str, Any]:
        request_id = request_id or uuid.uuid4().hex
        when = (self._decide(task, inputs, params, request_id)
                if self.store is not None else None)
        if when is None or not when.deferred:
            outputs, outcome, server_ms = await self._route(task, inputs, params, request_id)
            return await self.results.accept(request_id, task, outputs, outcome, server_ms)
        now = self._wall()
        deadline_ms = float(params.get(protocol.DEADLINE, protocol.DEFAULT_DEADLINE_MS))
        held = Held(request_id, task, dict(params), inputs, now + when.wait_s,
                    now + deadline_ms / 1000.0)
        assert self.store is not None
        await asyncio.to_thread(self.store.put, held)
        key = result_key(self.results.uplink.node_id, request_id)
        return {"request_id": request_id, "status": "deferred", "run_after": held.run_at,
                "result_key": key, "est_cost_usd": when.est_cost,
                "now_cost_usd": when.now_cost}

    async def run_due(self, parallel: int = PARALLEL) -> int:
        """Run every held request whose time has come, ``parallel`` at a time; how many."""
        if self.store is None:
            return 0
        held = await asyncio.to_thread(self.store.due, self._wall())
        slots = asyncio.Semaphore(parallel)

        async def one(item: Held) -> None:
            async with slots:
                await self._run(item)

        await asyncio.gather(*(one(item) for item in held))
        return len(held)

    async def _run(self, item: Held) -> None:
        left_ms = (item.deadline_at - self._wall()) * 1000.0
        params = {**item.params, protocol.DEADLINE: max(left_ms, 1.0)}
        try:
            outputs, outcome, server_ms = await self._route(item.task, item.inputs, params,
                                                            item.request_id)
            await self.results.accept(item.request_id, item.task, outputs, outcome,
                                      server_ms)
        except OutboxError:
            return  # kept: tried again on the next round
        except TierlinkError as exc:
            await self.results.refused(item.request_id, item.task, exc)
        assert self.store is not None
        await asyncio.to_thread(self.store.remove, item.request_id)

    async def loop(self, poll_s: float = POLL_S) -> None:
        while True:
            try:
                await self.run_due()
            except Exception:
                log.exception("running deferred requests failed")
            await asyncio.sleep(poll_s)


def no_state_dir(node_id: str) -> InvalidRequest:
    return InvalidRequest(f"{node_id} keeps no state_dir: it cannot answer asynchronously",
                          hint="send the request without tierlink.async")
