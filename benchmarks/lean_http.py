"""A lean HTTP/1.1 client for load generators: keep-alive connections over asyncio
streams, each request written as prepared bytes, each answer read by its Content-Length.

On a 2-core machine the generator shares the CPU with what it measures: aiohttp spends
about half a millisecond of CPU per request, which at 2,000 requests a second is most of a
core taken from the servers under test. This spends a fraction of that, so the figures say
what the servers can do rather than what the client could send.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class LeanPoster:
    """POSTs to one server over at most ``connections`` keep-alive connections."""

    def __init__(self, base_url: str, connections: int = 128, timeout_s: float = 10.0) -> None:
        url = urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self._host_header = f"{self.host}:{self.port}".encode()
        self.timeout_s = timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(connections)

    async def post(self, path: str, body: bytes, headers: bytes = b"") -> int:
        """The answer's status; raises OSError / TimeoutError / IncompleteReadError. A
        kept-alive connection the server closed meanwhile is replaced once, as HTTP
        clients do (the requests this sends are idempotent)."""
        async with self._slots, asyncio.timeout(self.timeout_s):
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._open()
            while True:
                try:
                    status, keep = await self._exchange(conn, path, body, headers)
                    break
                except BaseException as exc:
                    conn[1].close()
                    if not (reused and _closed_unanswered(exc)):
                        raise
                    reused, conn = False, await self._open()  # once: a fresh one
            if keep:
                self._idle.append(conn)
            else:
                conn[1].close()
            return status

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port)

    async def _exchange(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                        path: str, body: bytes, headers: bytes = b"") -> tuple[int, bool]:
        """``headers``: extra header lines, each ending in CRLF (a content type among them
        replaces the JSON one)."""
        reader, writer = conn
        ctype = b"" if b"content-type:" in headers.lower() else b"Content-Type: application/json\r\n"
        writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\n%s%sContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), self._host_header, ctype, headers, len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        status, length, keep = int(head[9:12]), 0, True
        for line in head.lower().split(b"\r\n")[1:]:
            if line.startswith(b"content-length:"):
                length = int(line[15:])
            elif line.startswith(b"connection:") and b"close" in line:
                keep = False
        if length:
            await reader.readexactly(length)
        return status, keep

    async def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


def _closed_unanswered(exc: BaseException) -> bool:
    """The server had closed the kept-alive connection: nothing of an answer came back."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return not exc.partial
    return isinstance(exc, ConnectionError)
