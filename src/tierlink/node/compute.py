"""One model run through the node's scheduler, timed (and slowed when a fault says so)."""

from __future__ import annotations

import time

import numpy as np

from tierlink.core.types import Priority
from tierlink.models.runtime import ModelRuntime
from tierlink.node.scheduler import Scheduler


async def run_model(scheduler: Scheduler, rt: ModelRuntime, inputs: dict[str, np.ndarray],
                    priority: Priority, deadline_s: float | None, slowdown: float = 1.0,
                    ) -> tuple[dict[str, np.ndarray], float]:
    """``rt`` on ``inputs`` when the scheduler's turn comes: (outputs, compute ms).
    ``slowdown`` > 1 is an injected fault: the run takes that many times as long, asleep on
    a worker thread (never on the event loop), like a slow CPU."""
    timing: list[float] = []

    def call() -> dict[str, np.ndarray]:
        start = time.perf_counter()
        try:
            out = rt.infer(inputs)
            if slowdown > 1.0:
                time.sleep((slowdown - 1.0) * (time.perf_counter() - start))
            return out
        finally:
            timing.append((time.perf_counter() - start) * 1000.0)

    # A runtime that waits on another process (Ray Serve) never runs on the loop thread,
    # however short its calls are.
    inline = slowdown <= 1.0 and not getattr(rt, "remote", False)
    out = await scheduler.submit(call, priority=priority, deadline_s=deadline_s,
                                 key=rt.info.name, inline=inline)
    return out, timing[0]
