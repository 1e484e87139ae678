"""The registry's service and routes: heartbeats, the view nodes watch, drains.

:class:`RegistryService` is what the endpoints do apart from HTTP (the store on the
injected clock, metrics); :func:`install_registry_routes` puts them on the app.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from tierlink.control.metrics import ControlMetrics
from tierlink.control.responses import error_response, unknown_node
from tierlink.control.schemas import Heartbeat, NodeRecord
from tierlink.control.store import RegistryStore
from tierlink.control.view_watch import MAX_WAIT_S, RevisionWatch
from tierlink.transport.openapi import model_schema, request_body

log = logging.getLogger(__name__)

Clock = Callable[[], float]
TIERS = ("device", "edge", "cloud")


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
        self._last_raw: dict[str, bytes] = {}  # node id -> its last heartbeat's bytes

    def repeat(self, node_id: str, raw: bytes) -> NodeRecord | None:
        """A heartbeat whose bytes are those of the node's last one: the store notes it
        without decoding or writing it again (None: it needs the whole path)."""
        if self._last_raw.get(node_id) != raw:
            return None
        record = self.store.repeat(node_id, self.clock(), self.ttl_s)
        if record is not None:
            self.metrics.heartbeats.inc()
        return record

    def heartbeat(self, heartbeat: Heartbeat, raw: bytes | None = None) -> NodeRecord:
        now = self.clock()
        record = self.store.upsert(heartbeat, now, self.ttl_s)
        if raw is not None:
            self._last_raw[heartbeat.node_id] = raw
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




def _parse_heartbeat(raw: bytes) -> Heartbeat:
    """The body as a :class:`Heartbeat`; a 422 naming the fields otherwise (as FastAPI's
    own validation of a body parameter would)."""
    try:
        return Heartbeat.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def install_registry_routes(app: FastAPI, service: RegistryService,
                            desired_for: Callable[[str], dict[str, Any]] | None,
                            routing_for: Callable[[int], dict[str, Any] | None] | None = None
                            ) -> None:
    """``/v1/nodes...`` and ``/v1/splits/...``: heartbeats (answered with what
    ``desired_for(node_id)`` says the node should serve: the rollouts; and, when the node
    runs another routing revision than ``routing_for`` holds, that revision), the watched
    view, one node, deregistration, drains."""
    @app.post("/v1/nodes/{node_id}/heartbeat",
              openapi_extra=request_body(model_schema(Heartbeat)))
    async def heartbeat(node_id: str, request: Request) -> Any:
        # The raw body first: a heartbeat that repeats the last one byte for byte (a quiet
        # node) is answered on the loop without decoding it or touching the disk.
        raw = await request.body()
        record = service.repeat(node_id, raw)
        if record is None:
            body = _parse_heartbeat(raw)
            if body.node_id != node_id:
                return error_response(
                    422, f"invalid heartbeat: node_id: {body.node_id!r} does not match the "
                    f"path's node id {node_id!r}", "invalid_request",
                    "post to /v1/nodes/{the body's node_id}/heartbeat")
            record = await asyncio.to_thread(service.heartbeat, body, raw)
        desired = desired_for(node_id) if desired_for is not None else {}
        answer = {"node_id": record.node_id, "generation": record.generation,
                  "registered_at": record.registered_at, "ttl_s": service.ttl_s,
                  "desired": desired, "draining": record.draining}
        routing = routing_for(record.routing_revision) if routing_for is not None else None
        if routing is not None:
            answer["routing"] = routing
        # Encoded here: FastAPI's response encoding cost as much as the rest of a repeat.
        return Response(json.dumps(answer, separators=(",", ":")).encode(),
                        media_type="application/json")

    @app.post("/v1/nodes/{node_id}/drain")
    def drain(node_id: str) -> Any:
        return _drained(node_id, True)

    @app.delete("/v1/nodes/{node_id}/drain")
    def undrain(node_id: str) -> Any:
        return _drained(node_id, False)

    def _drained(node_id: str, draining: bool) -> Any:
        if draining and service.get(node_id) is None:
            return unknown_node(node_id)
        changed = service.store.drain(node_id, draining)
        if changed:
            log.warning("node %s %s", node_id, "drained" if draining else "undrained")
        return {"node_id": node_id, "draining": draining, "changed": changed}

    watch = RevisionWatch(service.store.view_revision)
    app.state.view_watch = watch

    @app.get("/v1/nodes")
    async def nodes(splits: Literal["full", "digest"] = "full", since: str | None = None,
                    wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S)) -> Response:
        # The stored heartbeat texts, spliced: every node reads this, so its cost grows
        # with the square of the fleet; nothing is decoded or encoded again.
        # splits=digest: profiles (most of a record's bytes) by digest, fetched once each.
        # since=R: "unchanged" (no nodes) while the view is still at R; wait=S: wait up to
        # S seconds for it to move first (control/view_watch.py).
        revision = service.store.view_revision() if since is None or wait <= 0 \
            else await watch.wait_past(since, wait)
        if since is not None and revision == since:
            body = {"unchanged": True, "revision": revision, "ttl_s": service.ttl_s,
                    "now": service.clock()}
            return Response(json.dumps(body).encode(), media_type="application/json")
        now, records = await asyncio.to_thread(service.alive_json, splits == "digest")
        tail = json.dumps({"ttl_s": service.ttl_s, "now": now, "revision": revision})[1:]
        return Response(('{"nodes":[' + ",".join(records) + "]," + tail).encode(),
                        media_type="application/json")

    @app.get("/v1/splits/{digest}")
    def split_profile(digest: str) -> Response:
        text = service.split_profile(digest)
        if text is None:
            return error_response(404, f"no alive node reports a split profile with digest {digest!r}",
                          "split_profile_not_found", "fetch GET /v1/nodes?splits=digest again")
        return Response(f'{{"digest":{json.dumps(digest)},"splits":{text}}}'.encode(),
                        media_type="application/json")

    @app.get("/v1/nodes/{node_id}")
    def node(node_id: str) -> Any:
        record = service.get(node_id)
        return unknown_node(node_id) if record is None else record.model_dump(mode="json")

    @app.delete("/v1/nodes/{node_id}", status_code=204, response_class=Response)
    def deregister(node_id: str) -> Response:
        if not service.deregister(node_id):
            return unknown_node(node_id)
        return Response(status_code=204)
