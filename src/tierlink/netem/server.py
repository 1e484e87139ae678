"""Many emulated links in one event loop, with a small HTTP control API.

A launcher starts the emulator as its own process::

    python -m tierlink.netem.server --spec links.json --control-port 0 --ready-file ready.json

``links.json`` is a JSON list of :class:`~tierlink.netem.link.LinkSpec` mappings. Once every
link listens and the control API answers, the ready file is written (atomically)::

    {"pid": 1234, "control_port": 40001, "control_url": "http://127.0.0.1:40001",
     "links": {"device-1->edge-1": {"listen_host": "127.0.0.1", "listen_port": 40002}}}

The process runs until SIGTERM or SIGINT, then closes every link, socket and task, removes the
ready file and exits 0.

Control API (FastAPI, on its own port):

* ``GET /healthz`` -> ``{"status": "ok", "links": N}``
* ``GET /links`` -> ``{"links": [spec fields + actual listen_port + "counters"]}``
* ``GET /links/{name}`` -> one link
* ``PUT /links/{name}`` with any of ``delay_ms, jitter_ms, bandwidth_mbit, loss, up``
  -> the updated link; 400 for a bad field or value, 404 for an unknown link.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

from tierlink.errors import LinkEmulationError, TierlinkError, error_from_dict
from tierlink.netem.link import Link, LinkSpec

if TYPE_CHECKING:
    import httpx
    import uvicorn
    from fastapi import FastAPI

__all__ = [
    "EmulatorReady",
    "LinkControlClient",
    "LinkEmulator",
    "create_control_app",
    "load_specs",
    "main",
    "read_ready_file",
    "run_links",
]

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 10.0


class LinkEmulator:
    """Holds many :class:`Link` objects in one event loop (the caller's).

    ``seed`` makes every link's jitter and loss reproducible (each link gets its own stream,
    derived from the seed and its name, so adding a link does not change the others' draws).
    """

    def __init__(self, specs: Sequence[LinkSpec], *, seed: int | None = None) -> None:
        names = [s.name for s in specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise LinkEmulationError(f"duplicate link name(s) {duplicates}",
                                     hint="give every link a unique name")
        self._links = {s.name: Link(s, rng=_rng(seed, s.name)) for s in specs}

    @property
    def links(self) -> dict[str, Link]:
        return dict(self._links)

    def link(self, name: str) -> Link:
        try:
            return self._links[name]
        except KeyError:
            raise LinkEmulationError(f"no link named {name!r}; known: {sorted(self._links)}",
                                     hint="list the links with GET /links") from None

    async def start(self) -> None:
        """Start every link; if one cannot listen, stop those already started and raise."""
        try:
            for link in self._links.values():
                await link.start()
        except LinkEmulationError:
            await self.stop()
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(link.stop() for link in self._links.values()))

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def update(self, name: str, **changes: Any) -> LinkSpec:
        return self.link(name).update(**changes)

    def snapshot(self) -> list[dict[str, Any]]:
        return [link.snapshot() for link in self._links.values()]

    def listen_ports(self) -> dict[str, dict[str, Any]]:
        return {name: {"listen_host": link.spec.listen_host, "listen_port": link.listen_port}
                for name, link in self._links.items()}


def _rng(seed: int | None, name: str) -> random.Random:
    return random.Random(f"{seed}/{name}") if seed is not None else random.Random()


# --- the control API -----------------------------------------------------------------------


def create_control_app(emulator: LinkEmulator) -> FastAPI:
    """The FastAPI app serving the control API over ``emulator`` (same event loop)."""
    from fastapi import Body, FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = FastAPI(title="tierlink link emulator", docs_url=None, redoc_url=None)

    def failure(exc: TierlinkError, status: int) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def not_json(_: Any, exc: RequestValidationError) -> JSONResponse:
        return failure(LinkEmulationError(f"the body is not JSON: {exc.errors()}",
                                          hint=_BODY_HINT), 400)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "links": len(emulator.links)}

    @app.get("/links")
    async def list_links() -> dict[str, Any]:
        return {"links": emulator.snapshot()}

    @app.get("/links/{name}", response_model=None)
    async def get_link(name: str) -> dict[str, Any] | JSONResponse:
        try:
            return emulator.link(name).snapshot()
        except LinkEmulationError as exc:
            return failure(exc, 404)

    @app.put("/links/{name}", response_model=None)
    async def put_link(name: str,
                       body: Any = Body(None)) -> dict[str, Any] | JSONResponse:  # noqa: B008
        try:
            link = emulator.link(name)
        except LinkEmulationError as exc:
            return failure(exc, 404)
        try:
            link.update(**_fields(body))
        except LinkEmulationError as exc:
            return failure(exc, 400)
        return link.snapshot()

    return app


_BODY_HINT = 'send a JSON object of runtime fields, e.g. {"delay_ms": 20}'


def _fields(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise LinkEmulationError(f"the body must be a JSON object, got {body!r}",
                                 hint=_BODY_HINT)
    return body


# --- the process entry point ---------------------------------------------------------------


@dataclass(frozen=True)
class EmulatorReady:
    """What the ready file says: where the control API and each link listen."""

    pid: int
    control_port: int
    control_url: str
    link_ports: dict[str, int]


def read_ready_file(path: Path) -> EmulatorReady:
    """Parse a ready file written by :func:`run_links` (raises LinkEmulationError if bad)."""
    try:
        raw = json.loads(Path(path).read_text())
        return EmulatorReady(
            pid=int(raw["pid"]), control_port=int(raw["control_port"]),
            control_url=str(raw["control_url"]),
            link_ports={name: int(v["listen_port"]) for name, v in raw["links"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LinkEmulationError(f"cannot read the emulator's ready file {path}: {exc!r}",
                                 hint="is the link emulator running?") from exc


def load_specs(path: Path) -> list[LinkSpec]:
    """Read a JSON list of link spec mappings; errors name the file and the entry."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise LinkEmulationError(f"cannot read link specs from {path}: {exc}",
                                 hint="write a JSON list of link objects") from exc
    if not isinstance(raw, list):
        raise LinkEmulationError(f"{path}: the top level must be a JSON list of links",
                                 hint="write a JSON list of link objects")
    return [LinkSpec.from_dict(item, where=f"{path}: links[{i}]") for i, item in enumerate(raw)]


def run_links(specs: list[LinkSpec], control_port: int, ready_file: Path | None, *,
              control_host: str = "127.0.0.1", seed: int | None = None) -> None:
    """Run the links and the control API until SIGTERM/SIGINT, then shut down cleanly.

    ``control_port=0`` takes an ephemeral port (read it from the ready file). Must be called
    from the main thread (it installs signal handlers). Blocks.
    """
    asyncio.run(_serve(specs, control_port, ready_file, control_host, seed))


async def _serve(specs: list[LinkSpec], control_port: int, ready_file: Path | None,
                 control_host: str, seed: int | None) -> None:
    stop = asyncio.Event()
    with _signals_set(stop):
        async with LinkEmulator(specs, seed=seed) as emulator:
            server, serving = await _start_control(emulator, control_host, control_port)
            try:
                port = _bound_port(server)
                if ready_file is not None:
                    _write_ready(ready_file, emulator, control_host, port)
                log.info("link emulator ready: %d link(s), control API on %s:%d",
                         len(specs), control_host, port)
                await _first_of(stop, serving)
            finally:
                server.should_exit = True
                await serving
                if ready_file is not None:
                    Path(ready_file).unlink(missing_ok=True)
    log.info("link emulator stopped")


async def _first_of(event: asyncio.Event, serving: asyncio.Task[None]) -> None:
    """Return when ``event`` is set or the control server stops on its own."""
    waiter = asyncio.create_task(event.wait())
    try:
        await asyncio.wait({waiter, serving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)


@contextlib.contextmanager
def _signals_set(stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _start_control(emulator: LinkEmulator, host: str,
                         port: int) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """Start uvicorn in this loop on a socket bound here (so port 0 works); wait until up."""
    import uvicorn

    sock = _bind(host, port)
    config = uvicorn.Config(create_control_app(emulator), log_level="warning",
                            access_log=False, lifespan="off", timeout_graceful_shutdown=2)
    server = _quiet_server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    deadline = asyncio.get_running_loop().time() + _READY_TIMEOUT_S
    while not server.started:
        if serving.done() or asyncio.get_running_loop().time() > deadline:
            server.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)
            sock.close()
            raise LinkEmulationError(f"the control API did not start on {host}:{port}",
                                     hint="choose another --control-port")
        await asyncio.sleep(0.01)
    return server, serving


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LinkEmulationError(f"the control API cannot listen on {host}:{port}: {exc}",
                                 hint="choose another --control-port, or 0") from exc
    return sock


def _bound_port(server: uvicorn.Server) -> int:
    return int(server.servers[0].sockets[0].getsockname()[1])


def _quiet_server(config: uvicorn.Config) -> uvicorn.Server:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn without its own signal handling: the emulator owns SIGTERM/SIGINT."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer(config)


def _write_ready(path: Path, emulator: LinkEmulator, host: str, port: int) -> None:
    body = {"pid": os.getpid(), "control_port": port, "control_url": f"http://{host}:{port}",
            "links": emulator.listen_ports()}
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=2))
    tmp.replace(path)  # atomic: a launcher never reads half a file


# --- the client ----------------------------------------------------------------------------


class LinkControlClient:
    """A small synchronous client of the control API.

    Errors: an unreachable API raises LinkEmulationError; an error answer is rebuilt with
    :func:`tierlink.errors.error_from_dict` (LinkEmulationError for a bad field or link).
    """

    def __init__(self, url: str, *, timeout_s: float = 5.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        import httpx

        self._url = url.rstrip("/")
        self._http = httpx.Client(base_url=self._url, timeout=timeout_s, transport=transport)

    def list(self) -> list[dict[str, Any]]:
        """Every link: its spec fields, actual ``listen_port`` and ``counters``."""
        links = self._call("GET", "/links")["links"]
        return list(links)

    def get(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/links/{quote(name, safe='')}")

    def update(self, name: str, **fields: Any) -> dict[str, Any]:
        """Change runtime fields (delay_ms, jitter_ms, bandwidth_mbit, loss, up) of one link."""
        return self._call("PUT", f"/links/{quote(name, safe='')}", json=fields)

    def healthy(self) -> bool:
        try:
            return self._call("GET", "/healthz").get("status") == "ok"
        except LinkEmulationError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        import httpx

        try:
            response = self._http.request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise LinkEmulationError(
                f"cannot reach the link emulator at {self._url}: {exc!r}",
                hint="is `python -m tierlink.netem.server` running on that port?") from exc
        body = _body(response)
        if response.status_code >= 400:
            raise error_from_dict(body, response.status_code)
        return body


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return {"error": f"HTTP {response.status_code}: {response.text[:200]}"}
    return body


# --- command line --------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tierlink.netem.server",
                                     description="Run tierlink's user-space link emulator.")
    parser.add_argument("--spec", type=Path, required=True,
                        help="JSON file: a list of link specs")
    parser.add_argument("--control-port", type=int, default=0,
                        help="port of the HTTP control API (0 = ephemeral)")
    parser.add_argument("--control-host", default="127.0.0.1")
    parser.add_argument("--ready-file", type=Path, default=None,
                        help="written (JSON: ports) once everything listens; removed at exit")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for jitter and loss (reproducible runs)")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0, or 2 on a configuration error)."""
    args = _parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run_links(load_specs(args.spec), args.control_port, args.ready_file,
                  control_host=args.control_host, seed=args.seed)
    except TierlinkError as exc:
        print(f"link emulator: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
