"""The llama.cpp runtime's engine and conversations: one thread runs a context's work one
job at a time (a context is not thread-safe; later requests wait in order), and the
conversations it keeps between turns — the one it is working on lives in the context, the
others as saved sequence states, least recently used dropped past a count or byte cap.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TypeVar

from tierlink.llm.engine import EngineStats
from tierlink.llm.llama_context import LlamaContext

log = logging.getLogger("tierlink.llm")

T = TypeVar("T")

SAVED_BYTES = 256 * 2**20  # saved conversations' states kept, at most


class LlamaEngine:
    """``on_pass(rows, seconds)``: called after every llama_decode, as the torch engine's."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.stats = EngineStats()
        self.on_pass: Callable[[int, float], None] | None = None
        self._clock = clock
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llama.cpp", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the engine's thread after those before it (it reports its own
        outcome: the engine only runs it)."""
        self.stats.queued += 1
        self._jobs.put(job)

    def timed(self, rows: int, work: Callable[[], T]) -> T:
        """``work`` (one or more llama_decode calls over ``rows`` rows), counted."""
        t0, c0 = self._clock(), time.thread_time()
        try:
            return work()
        finally:
            spent = self._clock() - t0
            self.stats.passes += 1
            self.stats.rows += rows
            self.stats.busy_s += spent
            self.stats.cpu_s += time.thread_time() - c0
            if self.on_pass is not None:
                self.on_pass(rows, spent)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            self.stats.queued -= 1
            self.stats.running = 1
            try:
                job()
            except Exception:  # a job reports its own failures; this one escaped them
                log.exception("a llama.cpp job failed")
            finally:
                self.stats.running = 0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class LlamaSessions:
    """Conversations by key; ``None`` is a request without one (it may reuse whatever
    prefix the context holds, never a kept conversation's state)."""

    def __init__(self, ctx: LlamaContext, max_sessions: int = 64,
                 max_bytes: int = SAVED_BYTES) -> None:
        self.ctx = ctx
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.live: str | None = None  # whose sequence the context holds
        self._saved: OrderedDict[str, tuple[list[int], bytes]] = OrderedDict()

    def enter(self, key: str | None, prompt: list[int]) -> list[int]:
        """Make the context hold the most of ``prompt`` it can (conversation ``key``'s
        saved state, or the prefix it shares with what it holds); the tokens still to feed
        (at least one)."""
        shared = common_prefix(self.ctx.tokens, prompt)
        saved = self._saved.get(key) if key is not None and key != self.live else None
        if saved is not None and common_prefix(saved[0], prompt) > shared:
            self._park()
            del self._saved[key]  # type: ignore[arg-type]
            self.ctx.load(saved[1], saved[0])
            shared = common_prefix(self.ctx.tokens, prompt)
        elif key != self.live:
            self._park()
        self.live = key
        self.ctx.keep(min(shared, len(prompt) - 1))
        return prompt[len(self.ctx.tokens):]

    def leave(self, key: str | None) -> None:
        """A turn of ``key`` ended; a keyless one leaves nothing to keep."""
        if key is None:
            self.live = None

    def drop(self, key: str) -> bool:
        if self.live == key:
            self.live = None
            return True
        return self._saved.pop(key, None) is not None

    def __iter__(self) -> Iterator[str]:
        """The conversations held: the live one, then the saved ones."""
        if self.live is not None:
            yield self.live
        yield from self._saved

    def __len__(self) -> int:
        return len(self._saved) + (self.live is not None)

    def __contains__(self, key: str) -> bool:
        return key == self.live or key in self._saved

    def bytes_in_use(self) -> int:
        return sum(len(state) for _, state in self._saved.values())

    def _park(self) -> None:
        """Save the live conversation's state before the context holds another's."""
        if self.live is None or not self.ctx.tokens:
            return
        self._saved[self.live] = (list(self.ctx.tokens), self.ctx.save())
        self._saved.move_to_end(self.live)
        self.live = None
        total = self.bytes_in_use()
        while self._saved and (len(self._saved) > self.max_sessions or total > self.max_bytes):
            _, (_, state) = self._saved.popitem(last=False)
            total -= len(state)
