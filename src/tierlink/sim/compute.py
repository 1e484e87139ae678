"""A simulated node's compute: the node's own scheduler (``node/scheduler.py``: priority
queue, admission control, expiry, learned service times), its workers busy for simulated
time instead of running a model in a thread.

A job is a :class:`Work`: how long it runs and what it returns. How long comes from
:class:`ComputeModel`: the model card's latency on the machine that measured it, scaled by
the node's speed (a CPU quota, an injected slowdown, a device's thermal throttling) with
log-normal jitter, drawn from the simulation's seeded generator.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tierlink.node.job_queue import Job
from tierlink.node.scheduler import Scheduler, SchedulerConfig, SchedulerObserver
from tierlink.node.workers import BatchDone, JobDone


@dataclass(frozen=True, slots=True)
class Work:
    """What a simulated worker does: take ``seconds``, then answer ``result``."""

    seconds: float
    result: Any = None

    def __call__(self) -> Any:  # the scheduler's contract: a callable job
        return self.result


class SimWorkers:
    """Workers on simulated time (``node/workers.Workers``): a job keeps one busy for its
    :class:`Work`'s seconds, then answers; no threads."""

    def __init__(self) -> None:
        self._open = False

    @property
    def open(self) -> bool:
        return self._open

    def start(self) -> None:
        self._open = True

    def shutdown(self) -> None:
        self._open = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        return None  # answers come from the loop's own timers

    def run(self, job: Job, done: JobDone) -> None:
        work = job.fn
        seconds = work.seconds if isinstance(work, Work) else 0.0
        asyncio.get_running_loop().call_later(seconds, self._done, job, seconds, done)

    def run_batch(self, jobs: list[Job], done: BatchDone) -> None:
        raise RuntimeError("a simulated node does not batch: give its models no batching")

    def here(self, job: Job) -> tuple[Any, BaseException | None, float]:
        raise RuntimeError("a simulated job takes simulated time: submit it with inline=False")

    @staticmethod
    def _done(job: Job, seconds: float, done: JobDone) -> None:
        done(job, job.fn(), None, seconds)


class SimScheduler(Scheduler):
    """The node's scheduler with :class:`SimWorkers`."""

    def __init__(self, config: SchedulerConfig | None = None, *, clock: Callable[[], float],
                 observer: SchedulerObserver | None = None) -> None:
        super().__init__(config, clock=clock, observer=observer, workers=SimWorkers())


class Reply:
    """Where a simulated job's answer goes (the scheduler's ``JobFuture``): to ``call`` as
    ``(result, error)`` on the loop's next turn — as an asyncio future wakes the coroutine
    that awaits it —, or nowhere once given up (:meth:`cancel`: the job leaves the queue)."""

    __slots__ = ("_call", "_done", "_scheduler", "job")

    def __init__(self, call: Callable[[Any, Any], None], scheduler: Scheduler) -> None:
        self._call, self._scheduler = call, scheduler
        self._done = False
        self.job: Job | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any, /) -> None:
        self._done, self.job = True, None
        asyncio.get_running_loop().call_soon(self._deliver, result, None)

    def set_exception(self, exception: BaseException, /) -> None:
        self._done, self.job = True, None
        asyncio.get_running_loop().call_soon(self._deliver, None, exception)

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            if self.job is not None:
                self._scheduler.abandon(self.job)
        self.job, self._call = None, _nowhere

    def _deliver(self, result: Any, error: BaseException | None) -> None:
        # let go of the callback first: nothing it holds refers back here any more
        call, self._call = self._call, _nowhere
        call(result, error)


def _nowhere(_result: Any, _error: Any) -> None:
    pass


@dataclass
class ComputeModel:
    """Run time of one inference on a node: ``base_ms`` (the card's latency) / ``speed``,
    times log-normal noise of ``jitter`` (σ of the log)."""

    speed: float = 1.0  # 0.5: a half-core CPU quota; lowered by slowdowns and throttling
    jitter: float = 0.15
    overhead_ms: float = 0.0  # the node's own work around each model run (sim/http.py)

    def seconds(self, base_ms: float, rng: random.Random) -> float:
        noise = math.exp(rng.gauss(-0.5 * self.jitter ** 2, self.jitter)) if self.jitter else 1.0
        return base_ms / 1000.0 / max(self.speed, 1e-6) * noise + self.overhead_ms / 1000.0
