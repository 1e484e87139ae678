"""The node's request scheduler: a priority queue with admission control in front of a pool of
worker threads that run blocking inference calls (onnxruntime, a fake runtime in tests).

Lifecycle, from the node's lifespan and its HTTP handlers::

    scheduler = Scheduler(SchedulerConfig(workers=2, max_queue=64), observer=metrics)
    scheduler.start()                                   # creates the worker threads
    scheduler.seed_service_ms("fmnist-small", 0.4)      # prior from the model card
    out = await scheduler.submit(run, priority=Priority.INTERACTIVE,
                                 deadline_s=clock() + 0.050, key="fmnist-small")
    await scheduler.close()                             # no job is left hanging

Contract of ``submit``:

* It is refused AT ONCE with :class:`AdmissionRefused` (``details["reason"]`` is
  ``"queue_full"``, ``"deadline"`` or ``"shutting_down"``) when the job cannot be taken, or
  with its subclass :class:`EscalationShed` (``"escalation_shed"``) when an ``optional`` job
  (an escalation) finds ``escalation_queue`` jobs waiting.
* An admitted job is answered exactly once: with ``fn()``'s result, with the exception ``fn``
  raised (unchanged), with :class:`DeadlineExceeded` when its deadline passed while it waited
  (it is then not run), or with ``AdmissionRefused("shutting_down")`` when ``close()`` found it
  still queued.
* A submitter cancelled while its job waits removes the job: it is never run. A job already
  running cannot be stopped (it is a blocking call in a thread); its result is discarded.

Order of waiting jobs: ``(priority, deadline, seq)``: realtime before interactive before batch,
earliest deadline first within a class (no deadline sorts last), FIFO otherwise.

Threading: all bookkeeping (the heap, counters, EWMAs) is touched only on the event-loop thread.
Worker threads (``node/workers.py``) only run ``fn`` and hand the outcome back with one
``call_soon_threadsafe``, so there are no locks, and the observer is always called on the loop
thread. Use one scheduler from one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, Self, TypeVar

from tierlink.core.types import Priority
from tierlink.errors import ConfigError
from tierlink.node.admission import Admission, Ask, expired, shed
from tierlink.node.job_queue import (
    ABANDONED,
    DONE,
    QUEUED,
    RUNNING,
    Batchable,
    Job,
    JobFuture,
    JobQueue,
    batch_full,
    gather,
    hold_for,
)
from tierlink.node.service_times import ServiceTimes
from tierlink.node.workers import Workers, WorkerThreads
from tierlink.telemetry import tracing

__all__ = [
    "Batchable",
    "NullObserver",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerObserver",
    "SchedulerStats",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_PRIORITIES = tuple(Priority)


class SchedulerObserver(Protocol):
    """Metrics hooks. Called on the event-loop thread; must be cheap and must not block.

    An exception raised by a hook is logged and otherwise ignored: metrics never fail a job.
    """

    def on_admit(self, priority: Priority) -> None: ...

    def on_refuse(self, priority: Priority, reason: str) -> None: ...

    def on_start(self, priority: Priority, waited_s: float) -> None: ...

    def on_finish(self, priority: Priority, run_s: float, ok: bool) -> None: ...

    def on_expire(self, priority: Priority) -> None: ...

    def on_batch(self, key: str, size: int, held_s: float) -> None: ...


class NullObserver:
    """The default observer: records nothing."""

    def on_admit(self, priority: Priority) -> None:
        pass

    def on_refuse(self, priority: Priority, reason: str) -> None:
        pass

    def on_start(self, priority: Priority, waited_s: float) -> None:
        pass

    def on_finish(self, priority: Priority, run_s: float, ok: bool) -> None:
        pass

    def on_expire(self, priority: Priority) -> None:
        pass

    def on_batch(self, key: str, size: int, held_s: float) -> None:
        pass


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """How a node's scheduler is sized. Validated here, once.

    ``workers``: jobs run at once (one thread each). ``max_queue``: jobs that may wait beyond
    those running (0 = never queue). ``initial_service_ms``: prior for the global service-time
    EWMA before anything was measured. ``ewma_alpha``: weight of each new measurement.
    ``inline_below_ms``: a job whose key's learned run time is below this, submitted while a
    worker is free and nothing waits, runs on the event loop itself: two thread hand-offs
    (each a wake-up that waits for a CPU on a busy machine) cost more than such a model's
    run. 0 = always on a worker thread. ``escalation_queue``: jobs waiting at which an
    optional job (an escalation: its caller holds an answer) is refused; None = never.
    """

    workers: int = 1
    max_queue: int = 64
    escalation_queue: int | None = None
    initial_service_ms: float = 5.0
    ewma_alpha: float = 0.2
    inline_below_ms: float = 1.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"scheduler.workers must be >= 1, got {self.workers}")
        if self.max_queue < 0:
            raise ConfigError(f"scheduler.max_queue must be >= 0, got {self.max_queue}")
        if self.escalation_queue is not None and self.escalation_queue < 0:
            raise ConfigError(f"scheduler.escalation_queue must be >= 0, got "
                              f"{self.escalation_queue}")
        if not (self.initial_service_ms >= 0 and math.isfinite(self.initial_service_ms)):
            raise ConfigError(
                f"scheduler.initial_service_ms must be a finite number >= 0, "
                f"got {self.initial_service_ms}"
            )
        if not 0 < self.ewma_alpha <= 1:
            raise ConfigError(f"scheduler.ewma_alpha must be in (0, 1], got {self.ewma_alpha}")


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot of the scheduler, for heartbeats, metrics and the router's view of this node.

    Counters are totals since ``start()``. ``refused`` counts refusals at submit;
    ``shed`` counts admitted jobs failed by ``close()``; ``cancelled`` counts queued jobs whose
    submitter went away. Every admitted job ends in exactly one of completed, failed, expired,
    cancelled, shed, or is still queued / in flight.
    """

    queue_depth: int
    queue_depth_by_priority: Mapping[Priority, int]
    inflight: int
    workers: int
    max_queue: int
    service_ms_ewma: float
    service_ms_by_key: Mapping[str, float]
    admitted: int = 0
    refused: int = 0
    refused_by_reason: Mapping[str, int] = field(default_factory=dict)
    expired: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    shed: int = 0


class Scheduler:
    """Bounded-concurrency priority scheduler with admission control. See the module docstring.

    ``clock`` is the time base of deadlines, waits and measured run times (seconds, monotonic).
    It is called from worker threads too, so a fake clock must tolerate that.
    """

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: SchedulerObserver | None = None,
        workers: Workers | None = None,
    ) -> None:
        self._config = config if config is not None else SchedulerConfig()
        self._clock = clock
        self._observer: SchedulerObserver = observer if observer is not None else NullObserver()
        self._workers = self._config.workers
        # where jobs run: threads, unless given others (the simulator's)
        self._threads = workers if workers is not None else WorkerThreads(self._workers, clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._idle: asyncio.Event | None = None  # set by the last finishing job during close()
        self._queue = JobQueue()
        self._inflight = 0  # jobs running
        self._busy = 0  # workers running them (a batch is many jobs on one worker)
        self._times = ServiceTimes(self._config.initial_service_ms, self._config.ewma_alpha)
        self._admission = Admission(self._config.max_queue, self._workers, self._times,
                                    lambda p, reason: self._emit(self._observer.on_refuse, p,
                                                                 reason),
                                    self._config.escalation_queue)
        self._counts = {"admitted": 0, "expired": 0, "completed": 0, "failed": 0,
                        "cancelled": 0, "shed": 0}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Create the worker threads. Idempotent. The event loop is bound at the first submit."""
        if self._closing:
            raise RuntimeError("Scheduler.start() after close(): create a new Scheduler")
        self._threads.start()

    async def close(self) -> None:
        """Stop accepting, fail every queued job with ``AdmissionRefused("shutting_down")``,
        wait for the running jobs to finish (their submitters get their answers), then shut the
        threads down. Idempotent; safe to call if ``start()`` never was."""
        self._closing = True
        self._shed_queue()
        if self._inflight:
            if self._idle is None:  # a second concurrent close() waits on the same event
                self._idle = asyncio.Event()
            await self._idle.wait()
        self._threads.shutdown()  # every thread is idle by now: the join is immediate

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the hot path ----------------------------------------------------------------------

    async def submit(
        self,
        fn: Callable[[], T],
        *,
        priority: Priority,
        deadline_s: float | None,
        cost_hint_ms: float | None = None,
        key: str = "",
        inline: bool = True,
        batch: Batchable | None = None,
        optional: bool = False,
    ) -> T:
        """Run blocking ``fn`` on a worker thread and return its result (on the loop itself
        when it is short, see ``SchedulerConfig.inline_below_ms``; ``inline=False`` never).

        ``deadline_s``: ABSOLUTE time on this scheduler's clock by which the job must finish;
        None = no deadline. ``cost_hint_ms``: this job's expected run time if the caller knows
        it better than the EWMA of ``key`` (e.g. a batch of 8). ``key``: what to learn the
        service time under, usually the model variant. ``batch``: the job may run together
        with waiting jobs of the same batch key (one call of ``batch.run`` instead of ``fn``:
        see :meth:`_gather`). ``optional``: an escalation's job (see ``escalation_queue``).
        Raises as the module docstring says.
        """
        future: asyncio.Future[T] = self._bind_loop().create_future()
        job = self.admit(fn, priority=priority, deadline_s=deadline_s, future=future,
                         cost_hint_ms=cost_hint_ms, key=key, inline=inline, batch=batch,
                         optional=optional)
        try:
            return await future
        except asyncio.CancelledError:
            self.abandon(job)
            raise

    def admit(
        self,
        fn: Callable[[], Any],
        *,
        priority: Priority,
        deadline_s: float | None,
        future: JobFuture,
        cost_hint_ms: float | None = None,
        key: str = "",
        inline: bool = True,
        batch: Batchable | None = None,
        optional: bool = False,
    ) -> Job:
        """What :meth:`submit` does before it waits: admit the job (or refuse it at once),
        queue it or start it; ``future`` gets its answer. For a caller that is not a
        coroutine (the simulator): it hands the job back to :meth:`abandon` when it goes
        away before the answer."""
        loop = self._bind_loop()
        priority = Priority(priority)  # a plain int would break labels deep in a callback
        now = self._clock()
        self._admission.check(Ask(priority, deadline_s, cost_hint_ms, key, now, optional),
                              self._queue, self._inflight, self._busy, self._closing)
        job = Job(fn, priority, math.inf if deadline_s is None else deadline_s, key,
                  future, now, trace=tracing.capture(), batch=batch)
        self._counts["admitted"] += 1
        self._emit(self._observer.on_admit, priority)
        # Invariant between callbacks: a worker is free only when nothing live is queued,
        # or the first job waiting is held for a batch to fill (``hold_until``).
        if self._busy < self._workers and not self._queue:
            hold_s = hold_for(job, now, self._times.estimate_ms(key))
            if hold_s > 0:
                job.hold_until = now + hold_s
                self._queue.push(job)
                loop.call_later(hold_s, self._release, job)
            elif batch is not None:  # on a worker: the loop stays free for others to queue
                self._emit(self._observer.on_batch, key, 1, 0.0)
                self._start(job, now)
            elif inline and self._short(key):
                self._run_inline(job, now)
            else:
                self._start(job, now)
        else:
            self._queue.push(job)
            self._dispatch()  # a held batch this job fills, or one it overtakes
        return job

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return loop
        if not self._threads.open and not self._closing:
            raise RuntimeError("Scheduler.submit() before start(): call start() first")
        if self._loop is not None:
            raise RuntimeError("a Scheduler serves one event loop; create one per loop")
        self._loop = loop
        self._threads.bind(loop)
        return loop

    def _start(self, job: Job, now: float) -> None:
        self._begin_alone(job, now)
        self._threads.run(job, self._finish)

    def _start_batch(self, jobs: list[Job], now: float) -> None:
        """``jobs`` (two or more of one batch key) as one call on one worker."""
        for job in jobs:
            self._begin(job, now)
        self._busy += 1
        self._threads.run_batch(jobs, self._finish_batch)

    def _begin(self, job: Job, now: float) -> None:
        job.state = RUNNING
        self._inflight += 1
        self._emit(self._observer.on_start, job.priority, now - job.enqueued_at)

    def _begin_alone(self, job: Job, now: float) -> None:
        """``job`` takes a worker of its own."""
        self._begin(job, now)
        self._busy += 1

    def _short(self, key: str) -> bool:
        limit = self._config.inline_below_ms
        return limit > 0 and self._times.estimate_ms(key) < limit

    def _run_inline(self, job: Job, now: float) -> None:
        """Run a short job right here on the loop thread, accounted as a running job
        (only ``Exception``s are the job's: anything else belongs to the loop)."""
        self._begin_alone(job, now)
        self._finish(job, *self._threads.here(job))

    def _finish(self, job: Job, result: Any, error: BaseException | None, run_s: float) -> None:
        """Loop thread: answer the submitter, learn the run time, start the next job."""
        self._busy -= 1
        if error is None:
            # Only successes teach the EWMA: a failure may be a fast reject of bad input.
            self._times.learn(job.key, run_s * 1000.0)
        self._answer(job, result, error, run_s)
        self._next()

    def _finish_batch(self, jobs: list[Job], results: list[Any], error: BaseException | None,
                      run_s: float) -> None:
        """Loop thread: answer every job of a batch; learn the run time per job."""
        self._busy -= 1
        if error is None and len(results) != len(jobs):
            error = RuntimeError(f"a batch of {len(jobs)} returned {len(results)} results")
        if error is None:
            self._times.learn(jobs[0].key, run_s * 1000.0 / len(jobs))
        for i, job in enumerate(jobs):
            self._answer(job, results[i] if error is None else None, error, run_s)
        self._next()

    def _answer(self, job: Job, result: Any, error: BaseException | None, run_s: float) -> None:
        self._inflight -= 1
        job.state = DONE
        ok = error is None
        self._counts["completed" if ok else "failed"] += 1
        if not job.future.done():  # done = cancelled: the client went away mid-run
            if error is None:
                job.future.set_result(result)
            else:
                job.future.set_exception(error)
        self._emit(self._observer.on_finish, job.priority, run_s, ok)
        if job.trace is not None:
            _trace(job, run_s, error, self._clock())

    def _next(self) -> None:
        self._dispatch()
        if self._inflight == 0 and self._idle is not None:
            self._idle.set()

    def _dispatch(self) -> None:
        """Fill free workers from the heap; expire jobs whose deadline passed while waiting;
        run waiting jobs of one batch key together; leave a held batch to fill."""
        while self._busy < self._workers and self._queue:
            now = self._clock()
            head = self._queue.peek()
            if head.hold_until > now and not batch_full(self._queue, head):
                return  # its timer dispatches again
            job = self._queue.pop()
            if now >= job.deadline:
                self._expire(job, now)
                continue
            jobs = [job]
            if job.batch is not None:
                jobs, expired = gather(self._queue, job, now, self._times.estimate_ms(job.key))
                for late in expired:
                    self._expire(late, now)
            if job.batch is not None:
                held_s = now - job.enqueued_at if job.hold_until else job.held_s
                self._emit(self._observer.on_batch, job.key, len(jobs), held_s)
            if len(jobs) > 1:
                self._start_batch(jobs, now)
            else:
                self._start(job, now)

    # -- batches ---------------------------------------------------------------------------

    def _release(self, job: Job) -> None:
        """``job``'s hold is over: it runs with whoever joined it (its timer; the clocks of
        the loop and of the scheduler need not agree to the nanosecond)."""
        if job.hold_until:
            job.held_s = min(self._clock(), job.hold_until) - job.enqueued_at
            job.hold_until = 0.0
        self._dispatch()

    # -- the queue -------------------------------------------------------------------------

    def abandon(self, job: Job) -> None:
        """The submitter was cancelled. A queued job is removed (lazily); a running one is
        left to finish and its answer discarded."""
        if job.state != QUEUED:
            return
        self._queue.take(job, ABANDONED)
        self._counts["cancelled"] += 1

    def _expire(self, job: Job, now: float) -> None:
        job.state = DONE
        self._counts["expired"] += 1
        if job.future.done():  # cancelled, its submitter not yet told (abandon)
            return
        job.future.set_exception(expired(job, now))
        self._emit(self._observer.on_expire, job.priority)

    def _shed_queue(self) -> None:
        for job in self._queue.drain():
            job.state = DONE
            self._counts["shed"] += 1
            if job.future.done():  # cancelled, its submitter not yet told (abandon)
                continue
            job.future.set_exception(shed(job))
            self._emit(self._observer.on_refuse, job.priority, "shutting_down")

    # -- admission and estimates -----------------------------------------------------------

    def estimate_wait_ms(self, priority: Priority) -> float:
        """Expected wait before a job of ``priority`` submitted now would start
        (:meth:`Admission.wait_ms`)."""
        return self._admission.wait_ms(self._queue, self._inflight, priority)

    def load(self) -> tuple[int, int, int]:
        """``(queued, in flight, workers)`` now: a node's view of itself, without the
        copies :meth:`snapshot` makes."""
        return len(self._queue), self._inflight, self._workers

    @property
    def peak_queue(self) -> int:
        """The most jobs that ever waited at once (a hot spot's mark)."""
        return self._queue.peak

    @property
    def learned(self) -> int:
        """Grows at each service time learned or seeded (views that follow it rebuild)."""
        return self._times.learned

    def service_estimate_ms(self, key: str = "") -> float:
        """Expected run time of one job of ``key`` (its EWMA, else the global one)."""
        return self._times.estimate_ms(key)

    def seed_service_ms(self, key: str, service_ms: float) -> None:
        """Set the prior run time of ``key`` (e.g. a model card's latency) before it is
        measured; later measurements are blended into it."""
        self._times.seed(key, service_ms)

    # -- introspection ---------------------------------------------------------------------

    def snapshot(self) -> SchedulerStats:
        """A consistent copy of the counters (call it on the loop thread)."""
        counts = self._counts
        return SchedulerStats(
            queue_depth=len(self._queue),
            queue_depth_by_priority=MappingProxyType(
                {p: self._queue.by_priority[p] for p in _PRIORITIES}
            ),
            inflight=self._inflight,
            workers=self._workers,
            max_queue=self._config.max_queue,
            service_ms_ewma=self._times.overall_ms,
            service_ms_by_key=MappingProxyType(dict(self._times.by_key)),
            admitted=counts["admitted"],
            refused=sum(self._admission.refused_by_reason.values()),
            refused_by_reason=MappingProxyType(dict(self._admission.refused_by_reason)),
            expired=counts["expired"],
            completed=counts["completed"],
            failed=counts["failed"],
            cancelled=counts["cancelled"],
            shed=counts["shed"],
        )

    @property
    def accepting(self) -> bool:
        """True between ``start()`` and ``close()``."""
        return self._threads.open and not self._closing

    @staticmethod
    def _emit(hook: Callable[..., None], *args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            log.exception("scheduler observer %s failed; the job is unaffected", hook)


def _trace(job: Job, run_s: float, error: BaseException | None, now: float) -> None:
    """A traced job's queue wait and compute as spans, recorded after the fact from its times
    (it may have run on a worker thread)."""
    attrs = {"tierlink.job": job.key, "tierlink.priority": job.priority.label}
    tracing.record("tierlink.queue", job.trace, job.enqueued_at, job.began, now, attrs)
    tracing.record("tierlink.compute", job.trace, job.began, job.began + run_s, now,
                   {**attrs, "tierlink.error": None if error is None else repr(error)[:200]})
