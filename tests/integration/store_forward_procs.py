"""The processes of the store-and-forward test (run as a script, not collected by pytest).

``control DB READY``: a control plane with only the result routes
(:func:`tierlink.control.results.install_result_routes`) and ``/metrics``, on a free
loopback port written to READY as ``{"port": n}`` once it listens.

``edge STATE CONTROL_URL READY FD [NODE_ID]``: an edge node (``edge-1`` by default) with only the inbox route
(:func:`tierlink.node.inbox_routes.install_inbox_routes`) relaying to CONTROL_URL through
its own :class:`~tierlink.node.uplink.Uplink`; it serves on the already bound socket FD
(inherited: the test picked the port before the edge existed, so the device could be
pointed at it while nothing listened) and answers ``GET /status`` with its uplink status.

``device STATE PARENT_URL FIRST COUNT [--drain] [--fallback URL]``: a device whose uplink
delivers to PARENT_URL (then to the fallback upstream when it fails); it answers asynchronous requests ``r{FIRST}`` .. ``r{COUNT-1}`` through
:class:`~tierlink.node.async_requests.AsyncResults`, printing ``TRY id`` before and
``ACCEPTED id <uplink state>`` after each, then ``QUEUED``. With ``--drain`` it waits until
its outbox is empty and prints ``STATE <up|down>`` and ``DRAINED``; otherwise it runs until
killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

NODE_DEVICE, NODE_EDGE = "dev-1", "edge-1"
FAST = {"backoff_base_s": 0.05, "backoff_max_s": 0.5}  # retry a dead edge quickly


def _serve(app: Any, sock: socket.socket, ready: Path) -> None:
    import uvicorn

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                tmp = ready.with_name(ready.name + ".tmp")
                tmp.write_text(json.dumps({"port": sock.getsockname()[1]}))
                os.replace(tmp, ready)  # a poller never reads half of it

    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    ReadyServer(config).run(sockets=[sock])


def control(db: str, ready: str) -> None:
    from fastapi import FastAPI, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from tierlink.control.results import ResultMetrics, ResultStore, install_result_routes

    store = ResultStore(db)
    metrics = ResultMetrics()
    app = FastAPI()
    install_result_routes(app, store, metrics=metrics)

    @app.get("/metrics")
    def scrape() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    _serve(app, socket.create_server(("127.0.0.1", 0)), Path(ready))


def _uplink_config() -> Any:
    from tierlink.node.uplink import UplinkConfig
    from tierlink.outbox import Backoff

    return UplinkConfig(backoff=Backoff(FAST["backoff_base_s"], FAST["backoff_max_s"]),
                        timeout_s=5.0)


def edge(state: str, control_url: str, ready: str, fd: int, node_id: str = NODE_EDGE) -> None:
    from fastapi import FastAPI

    from tierlink.node.inbox_routes import InboxReceiver, install_inbox_routes
    from tierlink.node.uplink import Uplink

    uplink = Uplink(node_id, state, control_url=control_url, config=_uplink_config())
    receiver = InboxReceiver.open(state, uplink)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        uplink.start()
        try:
            yield
        finally:
            await uplink.stop()
            receiver.close()

    app = FastAPI(lifespan=lifespan)
    install_inbox_routes(app, receiver)

    @app.get("/status")
    def status() -> dict[str, Any]:
        return uplink.status()

    sock = socket.socket(fileno=fd)  # bound by the test, listening from now on
    sock.listen(128)
    _serve(app, sock, Path(ready))


def _say(*words: str) -> None:
    print(*words, flush=True)


async def device(state: str, parent_url: str, first: int, count: int, drain: bool,
                 fallbacks: list[str]) -> None:
    import numpy as np

    from tierlink.core.types import Outcome, Tier
    from tierlink.node.async_requests import AsyncResults
    from tierlink.node.uplink import Uplink

    uplink = Uplink(NODE_DEVICE, state, parent_url=parent_url, config=_uplink_config(),
                    fallback_urls=fallbacks)
    uplink.start()
    results = AsyncResults(uplink)
    outputs = {"probabilities": np.array([[0.2, 0.8]], np.float32),
               "label": np.array([1], np.int64)}
    outcome = Outcome(NODE_DEVICE, Tier.DEVICE, "fmnist-small", (NODE_DEVICE,), 0.8)
    for i in range(first, count):
        request_id = f"r{i:04d}"
        _say("TRY", request_id)
        answer = await results.accept(request_id, "fmnist", outputs, outcome, 1.0)
        _say("ACCEPTED", request_id, answer["uplink"])
        await asyncio.sleep(0.005)
    _say("QUEUED")
    if not drain:
        await asyncio.Event().wait()  # until killed
    while uplink.outbox.pending():
        await asyncio.sleep(0.02)
    _say("STATE", uplink.state().state)
    await uplink.stop()
    _say("DRAINED")


def main(argv: list[str]) -> None:
    role, args = argv[0], argv[1:]
    if role == "control":
        control(args[0], args[1])
    elif role == "edge":
        edge(args[0], args[1], args[2], int(args[3]), *args[4:5])
    elif role == "device":
        fallbacks = [args[i + 1] for i, a in enumerate(args) if a == "--fallback"]
        asyncio.run(device(args[0], args[1], int(args[2]), int(args[3]), "--drain" in args,
                           fallbacks))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
