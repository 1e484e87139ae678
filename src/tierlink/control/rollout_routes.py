"""The rollout routes of the control plane (operators only: ``Bearer admin:<token>``).

    POST /v1/rollouts                         a RolloutIn body -> 201 the rollout record;
                                              400 a bad field, 404 an unpublished version,
                                              409 one is live for the model / no node
                                              of the tier serves it
    GET  /v1/rollouts                         {"rollouts": [record...], "now"}, newest
                                              first; ?model=NAME for one model's
    GET  /v1/rollouts/{id}                    the record with "transitions"; 404 unknown
    POST /v1/rollouts/{id}/pause|resume|promote|rollback
                                              body {"reason"?} -> the record; 409 when the
                                              action does not apply in the rollout's phase

A record is ``{"id", "spec", "state", "phase", "describe", "assignments", "share",
"created_at", "updated_at"}`` (see :meth:`RolloutController.record`). Handlers are plain
``def``: FastAPI runs them on a worker thread (SQLite, the controller's lock), off the loop.
Errors are :mod:`tierlink.errors` exceptions, turned into JSON by the app's handler.
"""

from __future__ import annotations

from typing import Any

# The web adapter: importing it means serving, so fastapi is imported here.
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from tierlink.control.rollouts import RolloutController
from tierlink.control.schemas import RolloutActionIn, RolloutIn
from tierlink.errors import ControlPlaneError, RolloutNotFound


def install_rollout_routes(app: FastAPI, controller: RolloutController | None) -> None:
    """Add the ``/v1/rollouts`` routes to ``app`` (``controller`` None: they answer 503,
    this control plane keeps no rollout store)."""

    def need() -> RolloutController:
        if controller is None:
            raise ControlPlaneError("this control plane keeps no rollout store",
                                    hint="run `tierlink control` with a SQLite --db")
        return controller

    @app.post("/v1/rollouts", status_code=201)
    def start(body: RolloutIn) -> JSONResponse:
        record = need().start(body.model_dump(exclude_none=True))
        return JSONResponse(record, status_code=201)

    @app.get("/v1/rollouts")
    def rollouts(model: str | None = None) -> dict[str, Any]:
        ctl = need()
        return {"rollouts": ctl.records(model), "now": ctl.clock()}

    @app.get("/v1/rollouts/{rollout_id}")
    def rollout(rollout_id: str) -> dict[str, Any]:
        return need().get(_parse_id(rollout_id))

    @app.post("/v1/rollouts/{rollout_id}/{action}")
    def act(rollout_id: str, action: str, body: RolloutActionIn | None = None
            ) -> dict[str, Any]:
        reason = body.reason if body is not None else None
        return need().act(_parse_id(rollout_id), action, reason)


def _parse_id(text: str) -> int:
    """Rollout ids are integers; anything else names no rollout (404)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise RolloutNotFound(f"no rollout with id {text!r}")
    return int(text)
