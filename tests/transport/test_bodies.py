"""A request body read within a limit: refused by its declared length before anything is
read, or as soon as a stream without one passes the limit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from tierlink.errors import InvalidRequest
from tierlink.transport.bodies import read_bounded


def _request(chunks: list[bytes], length: int | None = None) -> tuple[Request, list[int]]:
    """A request whose body arrives in ``chunks``; the list counts the chunks read."""
    read = [0]
    headers = [(b"content-length", str(length).encode())] if length is not None else []

    async def receive() -> dict[str, Any]:
        i = read[0]
        read[0] += 1
        return {"type": "http.request", "body": chunks[i] if i < len(chunks) else b"",
                "more_body": i + 1 < len(chunks)}
    scope = {"type": "http", "method": "PUT", "path": "/", "headers": headers}
    return Request(scope, receive), read


def _too_large(size: int) -> InvalidRequest:
    return InvalidRequest(f"{size} bytes is too many")


def test_a_body_within_the_limit_is_read_whole() -> None:
    request, _ = _request([b"abc", b"def"], 6)
    assert asyncio.run(read_bounded(request, 6, _too_large)) == b"abcdef"


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    request, read = _request([b"x" * 10], 10)
    with pytest.raises(InvalidRequest, match="10 bytes"):
        asyncio.run(read_bounded(request, 8, _too_large))
    assert read == [0]


def test_a_stream_without_a_length_stops_once_past_the_limit() -> None:
    request, read = _request([b"x" * 5] * 100)
    with pytest.raises(InvalidRequest, match="10 bytes"):
        asyncio.run(read_bounded(request, 8, _too_large))
    assert read == [2]  # not the other 98 chunks
