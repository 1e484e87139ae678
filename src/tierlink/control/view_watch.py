"""Nodes watch the registry view instead of polling it: ``GET /v1/nodes?since=R&wait=S``
answers when the view's revision is no longer ``R`` (or after ``S`` seconds, with
``"unchanged": true`` and no nodes), so a quiet fleet costs a tiny answer per node every
``S`` seconds and a change reaches every watching node at once.

:class:`RevisionWatch` is what the waiting requests share: while any waits, one task reads
the store's revision every ``poll_s`` (an attribute read for SQLite; for etcd, the revision
its watch has applied) and wakes them all when it moves. Once the server shuts down
(:meth:`RevisionWatch.stop`) every waiter is answered "unchanged" at once: a replica on its
way out has nothing new to say, and must not make its watchers wait on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

MAX_WAIT_S = 30.0


class RevisionWatch:
    """Wake waiters when ``read()`` (the store's view revision) changes."""

    def __init__(self, read: Callable[[], str], poll_s: float = 0.02) -> None:
        self.read = read
        self.poll_s = poll_s
        self.waiting = 0
        self._moved: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.stopped = False

    async def wait_past(self, since: str, timeout_s: float) -> str:
        """The revision once it is not ``since``, or when ``timeout_s`` has passed; ``since``
        at once when the watch is stopped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(timeout_s, 0.0), MAX_WAIT_S)
        self.waiting += 1
        try:
            while (revision := self.read()) == since:
                if self.stopped:
                    return since
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                moved = self._event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(moved.wait(), remaining)
            return revision
        finally:
            self.waiting -= 1

    def _event(self) -> asyncio.Event:
        if self._moved is None:
            self._moved = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll(), name="tierlink-view-watch")
        return self._moved

    async def _poll(self) -> None:
        """Runs while anyone waits; each change wakes every waiter (a fresh event after)."""
        last = self.read()
        while self.waiting > 0:
            await asyncio.sleep(self.poll_s)
            now = self.read()
            if now != last and self._moved is not None:
                last = now
                self._moved.set()
                self._moved = asyncio.Event()

    def stop(self) -> None:
        """Answer every waiter, now and from now on, "unchanged" (the server is stopping)."""
        self.stopped = True
        if self._moved is not None:
            self._moved.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
