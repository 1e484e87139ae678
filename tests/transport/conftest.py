"""A tiny OIP v2 HTTP/1.1 server on loopback, built on asyncio streams and tierlink's codec.

It runs its own event loop in a background thread, so synchronous clients (tritonclient) and
tests that drive :class:`OipClient` with ``asyncio.run`` can both talk to it. Routes:

    GET  /v2/health/ready                 200
    GET  /v2/models/echo                  200 metadata; any other model: 404 model_not_found
    POST /v2/models/echo[/versions/V]/infer   echoes the inputs as outputs (honours requested
                                          outputs, binary flags, Content-Encoding, Accept-Encoding)
    POST /v2/models/busy/infer            429 {"code": "admission_refused", ...}
    POST /v2/models/crash/infer           500 text/plain
    POST /v2/models/garbage/infer         200 with a body that is not an OIP response
    POST /v2/models/slow/infer            answers only when the server stops
    POST /v2/models/lazy/infer            echoes after ``lazy_s``
    POST /v2/models/hangup/infer          closes the connection without answering

``replies[path]`` (a test sets it) answers that path (query string ignored) with a given
``(status, headers, body)`` instead; ``truncated[path] = (body, length)`` answers 200 with
``Content-Length: length`` and only ``body``, then hangs up.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tierlink.errors import AdmissionRefused, InvalidRequest, ModelNotFound, TierlinkError
from tierlink.transport.oip import (
    compress_body,
    decode_infer_request,
    encode_infer_response,
    error_body,
    parse_header_length,
)

Reply = tuple[int, dict[str, str], bytes]

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
}


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes


@dataclass
class TinyOipServer:
    host: str = "127.0.0.1"
    port: int = 0
    connections: int = 0
    lazy_s: float = 0.1
    received: list[Received] = field(default_factory=list)
    replies: dict[str, Reply] = field(default_factory=dict)
    truncated: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _release: asyncio.Event | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._release = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None and self._release is not None
        self._release.set()
        self._server.close()
        await self._server.wait_closed()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            await self._exchange(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer
        finally:
            writer.close()
            self._handlers.discard(task)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (received := await read_request(reader)) is not None:
            self.received.append(received)
            path = received.path.split("?")[0]
            if path in self.truncated:
                body, length = self.truncated[path]
                writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n".encode()
                             + body)
                await writer.drain()
                return  # hang up mid-body
            scripted = self.replies.get(path)
            reply = scripted if scripted is not None else await self._route(received)
            if reply is None:
                return  # hang up without answering
            writer.write(format_reply(*reply))
            await writer.drain()

    async def _route(self, req: Received) -> Reply | None:
        parts = req.path.strip("/").split("/")
        if req.method == "GET":
            return route_get(parts)
        model = parts[2] if len(parts) > 3 else ""
        if model == "slow":
            assert self._release is not None
            await self._release.wait()
        if model == "lazy":
            await asyncio.sleep(self.lazy_s)
        if model == "hangup":
            return None
        return route_infer(model, parts, req)


async def read_request(reader: asyncio.StreamReader) -> Received | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Received(method, path, headers, body)


def format_reply(status: int, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def error_reply(err: TierlinkError) -> Reply:
    return err.http_status, {"Content-Type": "application/json"}, error_body(err)


def route_get(parts: list[str]) -> Reply:
    if parts == ["v2", "health", "ready"]:
        return 200, {}, b""
    if parts == ["v2", "models", "echo"]:
        meta = {
            "name": "echo",
            "versions": ["1"],
            "platform": "tierlink",
            "inputs": [],
            "outputs": [],
        }
        return 200, {"Content-Type": "application/json"}, json.dumps(meta).encode()
    return error_reply(ModelNotFound(f"unknown model {'/'.join(parts[2:])!r}"))


def route_infer(model: str, parts: list[str], req: Received) -> Reply:
    if model == "busy":
        return error_reply(AdmissionRefused("queue full on edge-1", node="edge-1", queue=64))
    if model == "crash":
        return 500, {"Content-Type": "text/plain"}, b"boom"
    if model == "garbage":
        return 200, {"Content-Type": "application/json"}, b"{not an oip response"
    if model not in ("echo", "slow", "lazy"):
        return error_reply(ModelNotFound(f"unknown model {model!r}"))
    try:
        return echo(parts, req)
    except InvalidRequest as err:
        return error_reply(err)


def echo(parts: list[str], req: Received) -> Reply:
    request = decode_infer_request(
        req.body,
        parse_header_length(req.headers.get("inference-header-content-length")),
        req.headers.get("content-encoding"),
    )
    wanted = [o.name for o in request.outputs] or list(request.inputs)
    outputs = {name: request.inputs[name] for name in wanted if name in request.inputs}
    version = parts[4] if len(parts) > 5 else None
    body, headers = encode_infer_response(
        "echo", version, request.id, outputs, request.parameters, request.binary_outputs(outputs)
    )
    body, headers = compress_body(body, headers, req.headers.get("accept-encoding"))
    return 200, headers, body


class ServerThread:
    """Runs a :class:`TinyOipServer` on its own event loop in a daemon thread."""

    def __init__(self) -> None:
        self.server = TinyOipServer()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tiny-oip", daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the tiny OIP server thread did not stop"
        leftover = asyncio.all_tasks(self._loop)
        self._loop.close()
        assert not leftover, f"server tasks leaked: {leftover}"


@pytest.fixture
def oip_server() -> Iterator[TinyOipServer]:
    runner = ServerThread()
    runner.start()
    try:
        yield runner.server
    finally:
        runner.stop()
