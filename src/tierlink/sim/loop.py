"""An asyncio event loop on simulated time.

The simulator runs the node's own asyncio code — its scheduler, its dispatcher (fallbacks,
retries, hedges, timeouts) — so it needs an event loop whose clock is virtual: when nothing
is ready to run, the loop jumps straight to its next timer instead of sleeping. A simulated
hour passes in however long its callbacks take to run.

``loop.time()`` is the simulated time in seconds from 0; ``asyncio.sleep``, ``wait_for``,
``call_later`` and every timeout follow it. Nothing here reads the wall clock.
"""

from __future__ import annotations

import asyncio
import gc
import selectors
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
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
            raise SimulationStalled("the simulation is waiting on something that never "
                                    "happens: no timer is set and nothing is ready")
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
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_VirtualSelector(self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


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
