"""An asyncio event loop on simulated time.

The simulator runs the node's own code — its scheduler, its dispatcher's steps (fallbacks,
retries, hedges, timeouts) — with callbacks and timers, so it needs an event loop whose clock
is virtual: when nothing is ready to run, the loop jumps straight to its next timer instead
of sleeping. A simulated hour passes in however long its callbacks take to run.

``loop.time()`` is the simulated time in seconds from 0; ``asyncio.sleep``, ``wait_for``,
``call_later`` and every timeout follow it. Nothing here reads the wall clock.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import heapq
import selectors
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")
GC_EVERY = 100_000  # allocations between young-generation collections while a run lasts


class _VirtualSelector(selectors.BaseSelector):
    """A selector with no I/O: "waiting" up to ``timeout`` moves the clock forward by it."""

    def __init__(self, loop: VirtualLoop) -> None:
        self._loop = loop
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationStalled(_STALLED)
        self._loop.advance(max(timeout, 0.0))
        return []

    def close(self) -> None:
        self._map.clear()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._map


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else int(fileobj.fileno())


class SimulationStalled(RuntimeError):
    """Every coroutine waits on an event no timer will ever bring."""


class VirtualLoop(asyncio.SelectorEventLoop):
    """asyncio's loop with the clock virtual and the timer queue lean.

    Timers are kept as ``(when, seq, handle)`` in the heap rather than as bare handles: the
    heap then orders them in C instead of calling ``TimerHandle.__lt__`` a dozen times per
    timer (a simulated request sets several; that was a tenth of the loop's time). Timers
    due at the same moment run in the order they were set. One iteration otherwise does
    what ``BaseEventLoop._run_once`` does (drop cancelled timers, wait for the first one —
    here: move the clock to it —, run what is ready), without I/O or debug hooks.
    """

    def __init__(self) -> None:
        self._now = 0.0
        self._timer_seq = 0
        super().__init__(_VirtualSelector(self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def call_at(self, when: float, callback: Callable[[*_Ts], object],
                *args: *_Ts, context: contextvars.Context | None = None
                ) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        base: Any = self  # asyncio's own fields, untyped
        base._check_closed()
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        self._timer_seq += 1
        heapq.heappush(base._scheduled, (when, self._timer_seq, timer))
        base_timer: Any = timer
        base_timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        base: Any = self  # asyncio's own fields, untyped
        scheduled: list[tuple[float, int, Any]] = base._scheduled
        if (len(scheduled) > _MIN_TIMERS_TO_COMPACT
                and base._timer_cancelled_count > len(scheduled) // 2):
            kept = []
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            base._scheduled = scheduled = kept
            base._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                base._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[2]._scheduled = False
        ready = base._ready
        if not ready and not base._stopping:
            if not scheduled:
                raise SimulationStalled(_STALLED)
            self._now += min(max(0.0, scheduled[0][0] - self._now), _MAX_WAIT_S)
        end = self._now + self._clock_resolution
        while scheduled and scheduled[0][0] < end:
            handle = heapq.heappop(scheduled)[2]
            handle._scheduled = False
            ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()


_STALLED = ("the simulation is waiting on something that never happens: no timer is set "
            "and nothing is ready")
_MIN_TIMERS_TO_COMPACT = 100  # asyncio's own figures: compact once half are cancelled
_MAX_WAIT_S = 86400.0  # asyncio's longest select timeout: one step of the clock at most


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` to completion on a fresh virtual-time loop; return its result.

    While it runs, the cyclic garbage collector leaves alone what existed before (the
    models' recorded answers, the zoo's data: frozen) and runs rarely (every 100,000
    allocations instead of 700): a long simulation allocates millions of short-lived
    futures and handles, and scanning the whole heap again and again was a fifth of its
    time. Both are undone when it ends."""
    loop = VirtualLoop()
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], GC_EVERY), thresholds[1], thresholds[2])
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()
        gc.set_threshold(*thresholds)
        gc.unfreeze()
