"""Where a scheduler's jobs run (``node/scheduler.py`` decides which job runs when).

:class:`WorkerThreads` runs each job on one of ``workers`` threads — a batch as one call —
and hands its outcome (the result, what it raised, its run time on the scheduler's clock) back
to the event loop with one ``call_soon_threadsafe``; a job short enough to run on the loop
thread runs :meth:`~WorkerThreads.here`. The simulator's workers are busy for simulated time
instead (``sim/compute.py``). A job's exception is its submitter's, unchanged: a worker
thread hands back any ``BaseException`` a job raised, the loop thread only ``Exception``
(anything else belongs to the loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from tierlink.node.job_queue import Job

__all__ = ["BatchDone", "JobDone", "WorkerThreads", "Workers"]

log = logging.getLogger(__name__)

# (job, its result, what it raised, its run time in seconds): called on the loop thread
JobDone = Callable[[Job, Any, BaseException | None, float], None]
# (jobs, their results in order, what the batch raised, its run time in seconds)
BatchDone = Callable[[list[Job], list[Any], BaseException | None, float], None]


class Workers(Protocol):
    """What the scheduler needs of its workers."""

    @property
    def open(self) -> bool: ...
    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def bind(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def run(self, job: Job, done: JobDone) -> None: ...
    def run_batch(self, jobs: list[Job], done: BatchDone) -> None: ...
    def here(self, job: Job) -> tuple[Any, BaseException | None, float]: ...


class WorkerThreads:
    """``workers`` threads (created by :meth:`start`, joined by :meth:`shutdown`); the
    outcomes go back to the loop given to :meth:`bind`."""

    def __init__(self, workers: int, clock: Callable[[], float]) -> None:
        self._workers, self._clock = workers, clock
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def open(self) -> bool:
        return self._pool is not None

    def start(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._workers,
                                            thread_name_prefix="tierlink-worker")

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def run(self, job: Job, done: JobDone) -> None:
        assert self._pool is not None  # invariant: jobs are only admitted while open
        self._pool.submit(self._run, job, done)

    def run_batch(self, jobs: list[Job], done: BatchDone) -> None:
        """``jobs`` (two or more of one batch key) as one call on one worker."""
        assert self._pool is not None
        self._pool.submit(self._run_batch, jobs, done)

    def here(self, job: Job) -> tuple[Any, BaseException | None, float]:
        """Run a short job right here on the loop thread."""
        return self._call(job, Exception)

    def _run(self, job: Job, done: JobDone) -> None:
        """Worker thread: run ``fn``, measure it, hand the outcome to the loop thread."""
        self._hand_back(done, job, *self._call(job, BaseException))

    def _run_batch(self, jobs: list[Job], done: BatchDone) -> None:
        """Worker thread: run a batch's items together, hand the outcomes to the loop."""
        batch = jobs[0].batch
        assert batch is not None
        began = self._clock()
        results: list[Any] = []
        error: BaseException | None = None
        try:
            results = batch.run([job.batch.item for job in jobs if job.batch is not None])
        except BaseException as exc:  # noqa: BLE001 -- every job of the batch gets it, unchanged
            error = exc
        run_s = self._clock() - began
        for job in jobs:
            job.began = began
        self._hand_back(done, jobs, results, error, run_s)

    def _hand_back(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            # The loop was closed without close(): nobody can be waiting for this answer.
            log.warning("a job finished after its event loop closed; answer dropped")

    def _call(self, job: Job, catch: type[BaseException]
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
