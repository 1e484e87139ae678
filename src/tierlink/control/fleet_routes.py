"""The fleet view over HTTP: ``GET /v1/fleet`` (one snapshot, JSON), ``GET /v1/fleet/events``
(server-sent events: a snapshot every ``interval_s`` while it changes, a comment line to
keep the connection alive while it does not), and ``GET /ui`` (the page that draws them).

The data needs the operator token (``/v1/fleet`` is an operator path); the page itself
carries no data and no asset from anywhere else, so it loads on a machine without internet,
asks for the token once and reads the stream with it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import HTMLResponse, StreamingResponse

from tierlink.control.fleet_view import FleetView

UI_PATHS = ("/ui", "/ui/")


def install_fleet_routes(app: FastAPI, view: FleetView) -> None:
    @app.get("/v1/fleet")
    def fleet() -> dict[str, Any]:
        """The fleet as the page shows it (see ``tierlink.control.fleet_view``)."""
        return view.snapshot()

    @app.get("/v1/fleet/events", response_class=StreamingResponse)
    async def events(interval_s: float = Query(1.0, ge=0.2, le=60.0)) -> StreamingResponse:
        """Server-sent events: ``data: <snapshot JSON>`` whenever it changed, at most every
        ``interval_s``; ends when the control plane stops (the client reconnects)."""
        return StreamingResponse(_stream(view, interval_s), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache",
                                          "x-accel-buffering": "no"})

    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    @app.get("/ui/", response_class=HTMLResponse, include_in_schema=False)
    def ui() -> HTMLResponse:
        return HTMLResponse(_page(), headers={"cache-control": "no-cache"})


async def _stream(view: FleetView, interval_s: float) -> AsyncIterator[str]:
    last = ""
    yield "retry: 2000\n\n"
    while not view.closed.is_set():
        snapshot = view.snapshot()
        body = json.dumps({k: v for k, v in snapshot.items() if k != "at"}, sort_keys=True)
        if body != last:
            last = body
            yield f"data: {json.dumps(snapshot)}\n\n"
        else:
            yield ": unchanged\n\n"
        try:
            await asyncio.wait_for(view.closed.wait(), interval_s)
        except TimeoutError:
            pass


_PAGE: list[str] = []


def _page() -> str:
    if not _PAGE:  # read on first use, not at import
        _PAGE.append(resources.files("tierlink.control").joinpath("ui/fleet.html")
                     .read_text(encoding="utf-8"))
    return _PAGE[0]
