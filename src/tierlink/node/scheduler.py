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
  ``"queue_full"``, ``"deadline"`` or ``"shutting_down"``) when the job cannot be taken.
* An admitted job is answered exactly once: with ``fn()``'s result, with the exception ``fn``
  raised (unchanged), with :class:`DeadlineExceeded` when its deadline passed while it waited
  (it is then not run), or with ``AdmissionRefused("shutting_down")`` when ``close()`` found it
  still queued.
* A submitter cancelled while its job waits removes the job: it is never run. A job already
  running cannot be stopped (it is a blocking call in a thread); its result is discarded.

Order of waiting jobs: ``(priority, deadline, seq)``: realtime before interactive before batch,
earliest deadline first within a class (no deadline sorts last), FIFO otherwise.

Threading: all bookkeeping (the heap, counters, EWMAs) is touched only on the event-loop thread.
Worker threads only run ``fn`` and hand the outcome back with one ``call_soon_threadsafe``, so
there are no locks, and the observer is always called on the loop thread. Use one scheduler
from one event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, Self, TypeVar

from tierlink.core.types import Priority
from tierlink.errors import AdmissionRefused, ConfigError, DeadlineExceeded
from tierlink.telemetry import tracing

__all__ = [
    "NullObserver",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerObserver",
    "SchedulerStats",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_PRIORITIES = tuple(Priority)

# Job states. A job moves QUEUED -> RUNNING -> DONE, QUEUED -> DONE (expired / shed at close),
# or QUEUED -> ABANDONED (its submitter was cancelled; it stays in the heap as a tombstone).
_QUEUED, _RUNNING, _DONE, _ABANDONED = range(4)

# Rebuild the heap once tombstones outnumber live jobs (and there are enough to matter).
_COMPACT_MIN_TOMBSTONES = 64


class SchedulerObserver(Protocol):
    """Metrics hooks. Called on the event-loop thread; must be cheap and must not block.

    An exception raised by a hook is logged and otherwise ignored: metrics never fail a job.
    """

    def on_admit(self, priority: Priority) -> None: ...

    def on_refuse(self, priority: Priority, reason: str) -> None: ...

    def on_start(self, priority: Priority, waited_s: float) -> None: ...

    def on_finish(self, priority: Priority, run_s: float, ok: bool) -> None: ...

    def on_expire(self, priority: Priority) -> None: ...


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


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """How a node's scheduler is sized. Validated here, once.

    ``workers``: jobs run at once (one thread each). ``max_queue``: jobs that may wait beyond
    those running (0 = never queue). ``initial_service_ms``: prior for the global service-time
    EWMA before anything was measured. ``ewma_alpha``: weight of each new measurement.
    ``inline_below_ms``: a job whose key's learned run time is below this, submitted while a
    worker is free and nothing waits, runs on the event loop itself: two thread hand-offs
    (each a wake-up that waits for a CPU on a busy machine) cost more than such a model's
    run. 0 = always on a worker thread.
    """

    workers: int = 1
    max_queue: int = 64
    initial_service_ms: float = 5.0
    ewma_alpha: float = 0.2
    inline_below_ms: float = 1.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"scheduler.workers must be >= 1, got {self.workers}")
        if self.max_queue < 0:
            raise ConfigError(f"scheduler.max_queue must be >= 0, got {self.max_queue}")
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


@dataclass(slots=True, eq=False)
class _Job:
    fn: Callable[[], Any]
    priority: Priority
    deadline: float  # absolute, on the scheduler's clock; math.inf when none
    key: str
    future: asyncio.Future[Any]
    enqueued_at: float
    state: int = _QUEUED
    began: float = 0.0  # when it started running (the end of its queue wait)
    trace: Any = None  # the submitter's trace context (tracing on): queue and compute spans


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
    ) -> None:
        self._config = config if config is not None else SchedulerConfig()
        self._clock = clock
        self._observer: SchedulerObserver = observer if observer is not None else NullObserver()
        self._workers = self._config.workers
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._idle: asyncio.Event | None = None  # set by the last finishing job during close()
        # Heap of (priority, deadline, seq, job); seq is unique, so jobs are never compared.
        self._heap: list[tuple[int, float, int, _Job]] = []
        self._seq = 0
        self._queued_by_priority = [0] * len(_PRIORITIES)  # live jobs only, no tombstones
        self._queued = 0
        self._tombstones = 0
        self._inflight = 0
        self._ewma_ms = self._config.initial_service_ms
        self._ewma_by_key: dict[str, float] = {}
        self.learned = 0  # grows at each service time learned or seeded (views follow it)
        self._counts = {"admitted": 0, "expired": 0, "completed": 0, "failed": 0,
                        "cancelled": 0, "shed": 0}
        self._refused_by_reason: dict[str, int] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Create the worker threads. Idempotent. The event loop is bound at the first submit."""
        if self._closing:
            raise RuntimeError("Scheduler.start() after close(): create a new Scheduler")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self._workers, thread_name_prefix="tierlink-worker"
            )

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
        if self._executor is not None:
            # Every thread is idle by now, so this join is immediate.
            self._executor.shutdown(wait=True)
            self._executor = None

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
    ) -> T:
        """Run blocking ``fn`` on a worker thread and return its result (on the loop itself
        when it is short, see ``SchedulerConfig.inline_below_ms``; ``inline=False`` never).

        ``deadline_s``: ABSOLUTE time on this scheduler's clock by which the job must finish;
        None = no deadline. ``cost_hint_ms``: this job's expected run time if the caller knows
        it better than the EWMA of ``key`` (e.g. a batch of 8). ``key``: what to learn the
        service time under, usually the model variant. Raises as the module docstring says.
        """
        loop = self._bind_loop()
        priority = Priority(priority)  # a plain int would break labels deep in a callback
        now = self._clock()
        self._admit(priority, deadline_s, cost_hint_ms, key, now)
        job = _Job(fn, priority, math.inf if deadline_s is None else deadline_s, key,
                   loop.create_future(), now, trace=tracing.capture())
        self._counts["admitted"] += 1
        self._emit(self._observer.on_admit, priority)
        # Invariant between callbacks: a worker is free only when nothing live is queued.
        if self._inflight < self._workers and self._queued == 0:
            if inline and self._short(key):
                self._run_inline(job, now)
            else:
                self._start(job, now)
        else:
            self._enqueue(job)
        try:
            return await job.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return loop
        if self._executor is None and not self._closing:
            raise RuntimeError("Scheduler.submit() before start(): call start() first")
        if self._loop is not None:
            raise RuntimeError("a Scheduler serves one event loop; create one per loop")
        self._loop = loop
        return loop

    def _start(self, job: _Job, now: float) -> None:
        self._begin(job, now)
        assert self._executor is not None  # invariant: jobs are only admitted while open
        self._executor.submit(self._run, job)

    def _begin(self, job: _Job, now: float) -> None:
        job.state = _RUNNING
        self._inflight += 1
        self._emit(self._observer.on_start, job.priority, now - job.enqueued_at)

    def _short(self, key: str) -> bool:
        limit = self._config.inline_below_ms
        return limit > 0 and self._ewma_by_key.get(key, self._ewma_ms) < limit

    def _run_inline(self, job: _Job, now: float) -> None:
        """Run a short job right here on the loop thread, accounted as a running job
        (only ``Exception``s are the job's: anything else belongs to the loop)."""
        self._begin(job, now)
        self._finish(job, *self._call(job, Exception))

    def _run(self, job: _Job) -> None:
        """Worker thread: run ``fn``, measure it, hand the outcome to the loop thread."""
        outcome = self._call(job, BaseException)
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._finish, job, *outcome)
        except RuntimeError:
            # The loop was closed without close(): nobody can be waiting for this answer.
            log.warning("job %r finished after its event loop closed; answer dropped", job.key)

    def _call(self, job: _Job, catch: type[BaseException]
              ) -> tuple[Any, BaseException | None, float]:
        """Run ``fn``: (its result, what it raised of ``catch``, its run time in seconds)."""
        began = job.began = self._clock()
        result: Any = None
        error: BaseException | None = None
        try:
            result = job.fn()
        except catch as exc:  # handed to the submitter unchanged
            error = exc
        return result, error, self._clock() - began

    def _finish(self, job: _Job, result: Any, error: BaseException | None, run_s: float) -> None:
        """Loop thread: answer the submitter, learn the run time, start the next job."""
        self._inflight -= 1
        job.state = _DONE
        ok = error is None
        if ok:
            # Only successes teach the EWMA: a failure may be a fast reject of bad input.
            self._learn(job.key, run_s * 1000.0)
        self._counts["completed" if ok else "failed"] += 1
        if not job.future.done():  # done = cancelled: the client went away mid-run
            if error is None:
                job.future.set_result(result)
            else:
                job.future.set_exception(error)
        self._emit(self._observer.on_finish, job.priority, run_s, ok)
        if job.trace is not None:
            self._trace(job, run_s, error)
        self._dispatch()
        if self._inflight == 0 and self._idle is not None:
            self._idle.set()

    def _trace(self, job: _Job, run_s: float, error: BaseException | None) -> None:
        now, attrs = self._clock(), {"tierlink.job": job.key,
                                     "tierlink.priority": job.priority.label}
        tracing.record("tierlink.queue", job.trace, job.enqueued_at, job.began, now, attrs)
        tracing.record("tierlink.compute", job.trace, job.began, job.began + run_s, now,
                       {**attrs, "tierlink.error": None if error is None else repr(error)[:200]})

    def _dispatch(self) -> None:
        """Fill free workers from the heap; expire jobs whose deadline passed while waiting."""
        while self._inflight < self._workers and self._queued:
            job = self._pop()
            now = self._clock()
            if now >= job.deadline:
                self._expire(job, now)
            else:
                self._start(job, now)

    # -- the queue -------------------------------------------------------------------------

    def _enqueue(self, job: _Job) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (job.priority, job.deadline, self._seq, job))
        self._queued_by_priority[job.priority] += 1
        self._queued += 1

    def _pop(self) -> _Job:
        """The next live job. Only called while ``self._queued > 0``."""
        while True:
            job = heapq.heappop(self._heap)[3]
            if job.state == _QUEUED:
                self._queued_by_priority[job.priority] -= 1
                self._queued -= 1
                return job
            self._tombstones -= 1

    def _abandon(self, job: _Job) -> None:
        """The submitter was cancelled. A queued job is removed (lazily); a running one is
        left to finish and its answer discarded."""
        if job.state != _QUEUED:
            return
        job.state = _ABANDONED
        self._queued_by_priority[job.priority] -= 1
        self._queued -= 1
        self._tombstones += 1
        self._counts["cancelled"] += 1
        if self._tombstones >= _COMPACT_MIN_TOMBSTONES and self._tombstones > self._queued:
            self._heap = [entry for entry in self._heap if entry[3].state == _QUEUED]
            heapq.heapify(self._heap)
            self._tombstones = 0

    def _expire(self, job: _Job, now: float) -> None:
        job.state = _DONE
        self._counts["expired"] += 1
        waited_ms = (now - job.enqueued_at) * 1000.0
        late_ms = (now - job.deadline) * 1000.0
        job.future.set_exception(DeadlineExceeded(
            f"deadline passed while queued: waited {waited_ms:.1f} ms, the deadline was "
            f"{late_ms:.1f} ms ago; the job was not run",
            waited_ms=round(waited_ms, 3), late_ms=round(late_ms, 3),
            priority=job.priority.label,
        ))
        self._emit(self._observer.on_expire, job.priority)

    def _shed_queue(self) -> None:
        heap, self._heap = self._heap, []
        self._queued_by_priority = [0] * len(_PRIORITIES)
        self._queued = self._tombstones = 0
        for _, _, _, job in heap:
            if job.state != _QUEUED:
                continue
            job.state = _DONE
            self._counts["shed"] += 1
            job.future.set_exception(AdmissionRefused(
                "the node is shutting down: this queued job was not run",
                reason="shutting_down", priority=job.priority.label,
            ))
            self._emit(self._observer.on_refuse, job.priority, "shutting_down")

    # -- admission and estimates -----------------------------------------------------------

    def estimate_wait_ms(self, priority: Priority) -> float:
        """Expected wait before a job of ``priority`` submitted now would start.

        Jobs ahead = queued jobs with priority <= ``priority`` + jobs in flight. A worker frees
        for the new job once ``ahead - workers + 1`` of them finished; with ``workers``
        finishing in parallel that takes ``EWMA x that / workers``. 0 when a worker is free.
        Jobs of a higher class arriving later can still overtake (that is what expiry is for).
        """
        ahead = self._inflight
        for p in range(priority + 1):
            ahead += self._queued_by_priority[p]
        must_finish = ahead - self._workers + 1
        if must_finish <= 0:
            return 0.0
        return self._ewma_ms * must_finish / self._workers

    def load(self) -> tuple[int, int, int]:
        """``(queued, in flight, workers)`` now: a node's view of itself, without the
        copies :meth:`snapshot` makes."""
        return self._queued, self._inflight, self._workers

    def service_estimate_ms(self, key: str = "") -> float:
        """Expected run time of one job of ``key`` (its EWMA, else the global one)."""
        return self._ewma_by_key.get(key, self._ewma_ms)

    def seed_service_ms(self, key: str, service_ms: float) -> None:
        """Set the prior run time of ``key`` (e.g. a model card's latency) before it is
        measured; later measurements are blended into it."""
        if not (service_ms >= 0 and math.isfinite(service_ms)):
            raise ConfigError(f"service time of {key!r} must be finite and >= 0, got {service_ms}")
        self._ewma_by_key[key] = service_ms
        self.learned += 1

    def _learn(self, key: str, run_ms: float) -> None:
        alpha = self._config.ewma_alpha
        self.learned += 1
        self._ewma_ms += alpha * (run_ms - self._ewma_ms)
        if key:
            prev = self._ewma_by_key.get(key)
            # The first measurement of an unseeded key replaces the global fallback outright.
            self._ewma_by_key[key] = run_ms if prev is None else prev + alpha * (run_ms - prev)

    def _admit(
        self,
        priority: Priority,
        deadline_s: float | None,
        cost_hint_ms: float | None,
        key: str,
        now: float,
    ) -> None:
        """Raise AdmissionRefused if the job cannot be taken; otherwise return."""
        if self._closing:
            raise self._refuse("shutting_down", priority, deadline_s, cost_hint_ms, key, now)
        must_queue = self._inflight >= self._workers or self._queued > 0
        if must_queue and self._queued >= self._config.max_queue:
            raise self._refuse("queue_full", priority, deadline_s, cost_hint_ms, key, now)
        if deadline_s is None:
            return
        service_ms = cost_hint_ms if cost_hint_ms is not None else self.service_estimate_ms(key)
        if self.estimate_wait_ms(priority) + service_ms > (deadline_s - now) * 1000.0:
            raise self._refuse("deadline", priority, deadline_s, cost_hint_ms, key, now)

    def _refuse(
        self,
        reason: str,
        priority: Priority,
        deadline_s: float | None,
        cost_hint_ms: float | None,
        key: str,
        now: float,
    ) -> AdmissionRefused:
        """Count a refusal and build the error, with the numbers that decided it."""
        self._refused_by_reason[reason] = self._refused_by_reason.get(reason, 0) + 1
        self._emit(self._observer.on_refuse, priority, reason)
        wait_ms = self.estimate_wait_ms(priority)
        service_ms = cost_hint_ms if cost_hint_ms is not None else self.service_estimate_ms(key)
        remaining_ms = None if deadline_s is None else (deadline_s - now) * 1000.0
        budget = "no deadline" if remaining_ms is None else f"{remaining_ms:.1f} ms left"
        state = (
            f"queue {self._queued}/{self._config.max_queue}, {self._inflight} in flight on "
            f"{self._workers} workers, estimated wait {wait_ms:.1f} ms + service "
            f"{service_ms:.1f} ms, {budget}"
        )
        headline = {
            "queue_full": "the queue is full",
            "deadline": "the deadline cannot be met here",
            "shutting_down": "the node is shutting down",
        }[reason]
        return AdmissionRefused(
            f"admission refused ({reason}): {headline}: {state}",
            reason=reason, priority=priority.label, queue_depth=self._queued,
            max_queue=self._config.max_queue, inflight=self._inflight,
            workers=self._workers, estimated_wait_ms=round(wait_ms, 3),
            estimated_service_ms=round(service_ms, 3),
            remaining_ms=None if remaining_ms is None else round(remaining_ms, 3),
        )

    # -- introspection ---------------------------------------------------------------------

    def snapshot(self) -> SchedulerStats:
        """A consistent copy of the counters (call it on the loop thread)."""
        counts = self._counts
        return SchedulerStats(
            queue_depth=self._queued,
            queue_depth_by_priority=MappingProxyType(
                {p: self._queued_by_priority[p] for p in _PRIORITIES}
            ),
            inflight=self._inflight,
            workers=self._workers,
            max_queue=self._config.max_queue,
            service_ms_ewma=self._ewma_ms,
            service_ms_by_key=MappingProxyType(dict(self._ewma_by_key)),
            admitted=counts["admitted"],
            refused=sum(self._refused_by_reason.values()),
            refused_by_reason=MappingProxyType(dict(self._refused_by_reason)),
            expired=counts["expired"],
            completed=counts["completed"],
            failed=counts["failed"],
            cancelled=counts["cancelled"],
            shed=counts["shed"],
        )

    @property
    def accepting(self) -> bool:
        """True between ``start()`` and ``close()``."""
        return self._executor is not None and not self._closing

    @staticmethod
    def _emit(hook: Callable[..., None], *args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            log.exception("scheduler observer %s failed; the job is unaffected", hook)
