"""The scheduler's waiting jobs: a heap ordered by ``(priority, deadline, seq)`` with lazy
removal; what a job that may run in a batch carries (:class:`Batchable`), and the rules that
form a batch from the queue (:func:`hold_for`, :func:`batch_full`, :func:`gather`).

Touched only on the event-loop thread (see ``node/scheduler.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tierlink.core.types import Priority

__all__ = ["ABANDONED", "DONE", "QUEUED", "RUNNING", "Batchable", "Job", "JobFuture",
           "JobQueue", "batch_full", "gather", "hold_for"]

# Job states. A job moves QUEUED -> RUNNING -> DONE, QUEUED -> DONE (expired / shed at close),
# or QUEUED -> ABANDONED (its submitter was cancelled; it stays in the heap as a tombstone).
QUEUED, RUNNING, DONE, ABANDONED = range(4)

_PRIORITIES = tuple(Priority)

# Rebuild the heap once tombstones outnumber live jobs (and there are enough to matter).
_COMPACT_MIN_TOMBSTONES = 64


@dataclass(frozen=True, slots=True)
class Batchable:
    """What lets a job run together with others: jobs of the same ``key`` (a model version
    and its inputs' shapes) run as one call of ``run`` on their ``item`` s, which returns
    each one's result in order. ``limit``: the most jobs in one run; ``max_delay_s``: how
    long a job may be held for others while a worker is free."""

    key: str
    item: Any
    run: Callable[[Sequence[Any]], list[Any]]
    limit: int
    max_delay_s: float = 0.0


class JobFuture(Protocol):
    """Where a job's answer goes: an ``asyncio.Future`` (a coroutine awaits it) or the
    simulator's callback (``sim/compute.py``). Done once answered or given up on."""

    def done(self) -> bool: ...
    def set_result(self, result: Any, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


@dataclass(slots=True, eq=False)
class Job:
    fn: Callable[[], Any]
    priority: Priority
    deadline: float  # absolute, on the scheduler's clock; math.inf when none
    key: str
    future: JobFuture
    enqueued_at: float
    state: int = QUEUED
    began: float = 0.0  # when it started running (the end of its queue wait)
    trace: Any = None  # the submitter's trace context (tracing on): queue and compute spans
    batch: Batchable | None = None  # set: it may run with others of its key
    hold_until: float = 0.0  # held for others to join until then (a free worker waits)
    held_s: float = 0.0  # how long it was held, once its hold ended


class JobQueue:
    """Live jobs in run order; a job taken out of the middle (abandoned, or gathered into a
    batch) stays in the heap as a tombstone until popped or compacted away."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Job]] = []
        self._seq = 0
        self.by_priority = [0] * len(_PRIORITIES)  # live jobs only, no tombstones
        self._live = 0
        self._tombstones = 0
        self.peak = 0  # the most live jobs that ever waited at once

    def __len__(self) -> int:
        return self._live

    def push(self, job: Job) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (job.priority, job.deadline, self._seq, job))
        self.by_priority[job.priority] += 1
        self._live += 1
        self.peak = max(self.peak, self._live)

    def peek(self) -> Job:
        """The next live job, left in place. Only called while the queue is not empty."""
        while self._heap[0][3].state != QUEUED:
            heapq.heappop(self._heap)
            self._tombstones -= 1
        return self._heap[0][3]

    def pop(self) -> Job:
        """The next live job. Only called while the queue is not empty."""
        job = self.peek()
        heapq.heappop(self._heap)
        self._count_out(job)
        return job

    def take(self, job: Job, state: int) -> None:
        """``job`` (queued) leaves the queue from where it stands, now in ``state``."""
        job.state = state
        self._count_out(job)
        self._tombstones += 1
        if self._tombstones >= _COMPACT_MIN_TOMBSTONES and self._tombstones > self._live:
            self._heap = [entry for entry in self._heap if entry[3].state == QUEUED]
            heapq.heapify(self._heap)
            self._tombstones = 0

    def ahead(self, priority: Priority) -> int:
        """Live jobs that run before a new one of ``priority`` (same class included)."""
        return sum(self.by_priority[: priority + 1])

    def same_batch(self, key: str) -> list[Job]:
        """Live jobs that may run in a batch of ``key``, in run order."""
        return [entry[3] for entry in sorted(self._heap) if entry[3].state == QUEUED
                and entry[3].batch is not None and entry[3].batch.key == key]

    def drain(self) -> Iterator[Job]:
        """Every live job, the queue emptied."""
        heap, self._heap = self._heap, []
        self.by_priority = [0] * len(_PRIORITIES)
        self._live = self._tombstones = 0
        return (entry[3] for entry in heap if entry[3].state == QUEUED)

    def _count_out(self, job: Job) -> None:
        self.by_priority[job.priority] -= 1
        self._live -= 1


# -- batches -----------------------------------------------------------------------------


def hold_for(job: Job, now: float, per_job_ms: float) -> float:
    """How long ``job`` may wait on a free worker for others of its batch key: at most its
    batch's ``max_delay_s``, never a realtime job's, never past the time its deadline needs
    a full batch (``per_job_ms`` each) to start."""
    batch = job.batch
    if batch is None or batch.max_delay_s <= 0 or job.priority == Priority.REALTIME:
        return 0.0
    full_s = per_job_ms * batch.limit / 1000.0
    return max(0.0, min(batch.max_delay_s, job.deadline - now - full_s))


def batch_full(queue: JobQueue, job: Job) -> bool:
    """``job``'s batch could run full now."""
    assert job.batch is not None
    return len(queue.same_batch(job.batch.key)) >= job.batch.limit


def gather(queue: JobQueue, first: Job, now: float, per_job_ms: float
           ) -> tuple[list[Job], list[Job]]:
    """``first`` and the waiting jobs of its batch key that join it, in queue order — up to
    its limit, and only while the batch's estimated run time (``per_job_ms`` each) keeps
    every member's deadline (a job it would make late runs later, on its own turn); and
    the jobs found past their deadline, taken out to be expired."""
    batch = first.batch
    assert batch is not None
    jobs, expired, due = [first], [], first.deadline
    for job in queue.same_batch(batch.key):
        if len(jobs) >= batch.limit:
            break
        if now >= job.deadline:
            queue.take(job, DONE)
            expired.append(job)
            continue
        if now + per_job_ms * (len(jobs) + 1) / 1000.0 > min(due, job.deadline):
            continue
        queue.take(job, RUNNING)
        jobs.append(job)
        due = min(due, job.deadline)
    return jobs, expired
