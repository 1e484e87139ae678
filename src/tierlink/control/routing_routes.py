"""The routing routes of the control plane (writes: operators only).

    GET  /v1/routing          {"current": revision | null, "history": [revision...]} newest
                              first; a revision is {"revision", "routing", "at", "note"}
    PUT  /v1/routing          {"routing": {...section}, "note"?, "start"?} -> 201 the new
                              revision; 400 naming the key (unknown, invalid, a policy that
                              cannot be made, or one that needs a restart — unless ``start``:
                              the fleet starts with it, as ``tierlink up`` says)
    POST /v1/routing/revert   {"note"?} -> 201 a new revision with the previous one's
                              configuration; 409 when there is none

Nodes hear of a new revision in their next heartbeat's answer (``routing``) and swap to it
(see :mod:`tierlink.control.routing_revisions`). Handlers are plain ``def``: FastAPI runs
them on a worker thread (SQLite), off the loop.
"""

from __future__ import annotations

from typing import Any

# The web adapter: importing it means serving, so fastapi is imported here.
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tierlink.control.routing_revisions import RoutingControl
from tierlink.errors import ControlPlaneError


class RoutingIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    routing: dict[str, Any]
    note: str = Field(default="apply", max_length=200)
    # The fleet (re)starts with this section (`tierlink up`): anything may change.
    start: bool = False


class RevertIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field(default="", max_length=200)


def install_routing_routes(app: FastAPI, control: RoutingControl | None) -> None:
    """Add the ``/v1/routing`` routes (``control`` None: they answer 503, this control
    plane keeps no routing store)."""

    def need() -> RoutingControl:
        if control is None:
            raise ControlPlaneError("this control plane keeps no routing revisions",
                                    hint="run `tierlink control` with a SQLite --db or etcd")
        return control

    @app.get("/v1/routing")
    def current() -> dict[str, Any]:
        history = [r.to_dict() for r in need().store.history()]  # newest first
        return {"current": history[0] if history else None, "history": history}

    @app.put("/v1/routing", status_code=201)
    def apply(body: RoutingIn) -> JSONResponse:
        made = need().apply(body.routing, body.note, start=body.start)
        return JSONResponse(made.to_dict(), status_code=201)

    @app.post("/v1/routing/revert", status_code=201)
    def revert(body: RevertIn | None = None) -> JSONResponse:
        note = body.note if body is not None else ""
        return JSONResponse(need().revert(note).to_dict(), status_code=201)
