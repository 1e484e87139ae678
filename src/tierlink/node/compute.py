"""One model run through the node's scheduler, timed (and slowed when a fault says so),
batched with other requests for the same model when its ``batching:`` settings say so."""

from __future__ import annotations

import time

import numpy as np

from tierlink.core.types import Priority
from tierlink.models.runtime import ModelRuntime
from tierlink.node.batching import for_run
from tierlink.node.scheduler import Scheduler
from tierlink.settings.batching import BatchSettings


async def run_model(scheduler: Scheduler, rt: ModelRuntime, inputs: dict[str, np.ndarray],
                    priority: Priority, deadline_s: float | None, slowdown: float = 1.0,
                    batching: BatchSettings | None = None, optional: bool = False,
                    ) -> tuple[dict[str, np.ndarray], float]:
    """``rt`` on ``inputs`` when the scheduler's turn comes: (outputs, compute ms — a
    batch's time shared by its requests' rows). ``slowdown`` > 1 is an injected fault: the
    run takes that many times as long, asleep on a worker thread (never on the event
    loop), like a slow CPU. ``optional``: an escalation's run, refused first when the queue
    is deep (``SchedulerConfig.escalation_queue``)."""

    def call() -> tuple[dict[str, np.ndarray], float]:
        start = time.perf_counter()
        out = rt.infer(inputs)
        if slowdown > 1.0:
            time.sleep((slowdown - 1.0) * (time.perf_counter() - start))
        return out, (time.perf_counter() - start) * 1000.0

    # A runtime that waits on another process (Ray Serve) never runs on the loop thread,
    # however short its calls are.
    inline = slowdown <= 1.0 and not getattr(rt, "remote", False)
    out, ms = await scheduler.submit(call, priority=priority, deadline_s=deadline_s,
                                     key=rt.info.name, inline=inline,
                                     batch=for_run(rt, inputs, batching, slowdown),
                                     optional=optional)
    return out, ms
