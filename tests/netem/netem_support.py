"""Loopback servers and helpers shared by the netem tests (no fixtures: plain async helpers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from tierlink.netem.link import Link, LinkSpec


class _Handlers:
    """Tracks a test server's connection tasks so that closing it waits for all of them."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.writers: set[asyncio.StreamWriter] = set()

    def enter(self, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.writers.add(writer)

    async def close(self, server: asyncio.Server) -> None:
        server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await server.wait_closed()


@asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    """A TCP echo server on 127.0.0.1; yields its port, and closes every connection after."""
    handlers = _Handlers()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.enter(writer)
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        await handlers.close(server)


@asynccontextmanager
async def sink_server(expected: int) -> AsyncIterator[int]:
    """Reads ``expected`` bytes per connection, then answers b"OK"; yields its port."""
    handlers = _Handlers()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.enter(writer)
        try:
            await reader.readexactly(expected)
            writer.write(b"OK")
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        await handlers.close(server)


@asynccontextmanager
async def link_to(port: int, seed: int = 1, **fields: Any) -> AsyncIterator[Link]:
    """A started :class:`Link` in front of 127.0.0.1:``port``; stopped after."""
    import random

    link = Link(LinkSpec(name="test", target_host="127.0.0.1", target_port=port, **fields),
                rng=random.Random(seed))
    async with link:
        yield link


async def ping(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               payload: bytes = b"ping") -> float:
    """One echo round trip; returns seconds."""
    start = time.perf_counter()
    writer.write(payload)
    await writer.drain()
    await reader.readexactly(len(payload))
    return time.perf_counter() - start


async def connect(link: Link) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", link.listen_port)


def run(coro: Any) -> Any:
    """Run a scenario in a fresh loop and check it left no task behind."""

    async def checked() -> Any:
        result = await coro
        me = asyncio.current_task()
        leaked = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        assert not leaked, f"tasks left running: {leaked}"
        return result

    return asyncio.run(checked())
