"""Request bodies read within a limit: a body past it is refused by its declared length
before anything is read, and otherwise as soon as the stream passes it — a sender cannot
make a node buffer more than the route allows (a chunked body declares no length)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.requests import Request

    from tierlink.errors import TierlinkError


async def read_bounded(request: Request, limit: int,
                       too_large: Callable[[int], TierlinkError]) -> bytes:
    """``request``'s body; raises ``too_large(size)`` (the size declared or read so far) once
    it is over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(size)
        chunks.append(chunk)
    return b"".join(chunks)
