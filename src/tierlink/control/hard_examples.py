"""Hard examples at the control plane: what nodes escalated for low confidence, validated,
stored (capped), listed and exported as ``.npz``.

:class:`HardExampleService` is what the endpoints do apart from HTTP;
:func:`install_hard_example_routes` puts ``/v1/hard-examples`` on the app.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Query, Request, Response
from pydantic import ValidationError

from tierlink.control.identity import NODE, AdminRequired
from tierlink.control.metrics import ControlMetrics
from tierlink.control.schemas import HardExampleBatch, HardExampleIn, format_validation_error
from tierlink.control.store import AddResult, HardExampleStore, StoredExample
from tierlink.errors import ControlPlaneError, InvalidRequest
from tierlink.outbox import wire
from tierlink.transport.openapi import model_schema, request_body

log = logging.getLogger(__name__)

Clock = Callable[[], float]
BATCH_HINT = ("send {\"examples\": [...]} with the fields of "
              "tierlink.control.schemas.HardExampleIn; input.data is base64 of the raw "
              "little-endian bytes of input.datatype and input.shape")
_EXAMPLE_HINT = ("the payload of a hard_example item has the fields of "
                 "tierlink.control.schemas.HardExampleIn (see HardExample.to_wire)")
MAX_BATCH_BODY_BYTES = 64 * 1024 * 1024
MAX_PAGE = 1000
MAX_ID = 2**63 - 1  # ids are 64-bit signed integers (SQLite)


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
    return InvalidRequest(message, hint=BATCH_HINT)


def install_hard_example_routes(app: FastAPI, examples: HardExampleService | None) -> None:
    def need() -> HardExampleService:
        if examples is None:
            raise ControlPlaneError("this control plane keeps no hard-example store",
                                    hint="run `tierlink control` with a SQLite --db")
        return examples

    @app.post("/v1/hard-examples", openapi_extra=request_body(model_schema(HardExampleBatch)))
    async def post_examples(request: Request) -> dict[str, int]:
        body = await request.body()  # raw: validated by HardExampleBatch, 400 when bad
        caller = getattr(request.state, "caller", None)
        node = caller.node_id if caller is not None and caller.kind == NODE else None
        result = await asyncio.to_thread(need().add, body, node)  # decode + SQLite off the loop
        return {"stored": result.stored, "duplicates": result.duplicates,
                "evicted": result.evicted}

    # Plain `def` handlers: FastAPI runs them on a worker thread, off the event loop.
    @app.get("/v1/hard-examples")
    def list_examples(model: str | None = None, node: str | None = None,
                      after_id: int = Query(0, ge=0, le=MAX_ID),
                      limit: int = 100) -> dict[str, Any]:
        limit = _page_size(limit)
        records = need().store.page(model=model, node=node, after_id=after_id, limit=limit)
        return {"examples": [r.model_dump(mode="json") for r in records],
                "next_after_id": records[-1].id if len(records) == limit else None}

    @app.get("/v1/hard-examples/export")
    def export_examples(model: str | None = None, node: str | None = None,
                        limit: int | None = Query(None, ge=1, le=MAX_ID)) -> Response:
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
