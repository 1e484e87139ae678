"""Where a scheduler's jobs run: on a worker thread with the outcome handed back to the
loop thread, or on the loop thread itself for a short one."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tierlink.core.types import Priority
from tierlink.node.job_queue import Job
from tierlink.node.workers import WorkerThreads


def job(fn: Any) -> Job:
    return Job(fn, Priority.INTERACTIVE, float("inf"), "m", None, 0.0)  # type: ignore[arg-type]


def test_a_job_runs_on_a_worker_and_its_outcome_comes_back_on_the_loop_thread() -> None:
    async def main() -> list[tuple[Any, ...]]:
        workers = WorkerThreads(2, clock=lambda: 1.0)
        workers.start()
        workers.bind(asyncio.get_running_loop())
        got: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

        def done(j: Job, result: Any, error: BaseException | None, run_s: float) -> None:
            got.put_nowait((result, error, run_s, threading.current_thread().name))

        workers.run(job(lambda: threading.current_thread().name), done)
        boom = SystemExit(3)  # a BaseException of the job's own: handed back unchanged

        def fails() -> None:
            raise boom

        workers.run(job(fails), done)
        outcomes = [await asyncio.wait_for(got.get(), 5.0) for _ in range(2)]
        workers.shutdown()
        assert not workers.open
        return outcomes

    outcomes = asyncio.run(main())
    ran = next(o for o in outcomes if o[1] is None)
    failed = next(o for o in outcomes if o[1] is not None)
    assert ran[0].startswith("tierlink-worker") and ran[3] == "MainThread" and ran[2] == 0.0
    assert isinstance(failed[1], SystemExit) and failed[3] == "MainThread"


def test_a_short_job_runs_here_and_only_its_exceptions_are_its_own() -> None:
    workers = WorkerThreads(1, clock=lambda: 2.0)
    assert workers.here(job(lambda: 7)) == (7, None, 0.0)

    def fails() -> None:
        raise ValueError("bad input")

    result, error, _ = workers.here(job(fails))
    assert result is None and isinstance(error, ValueError)

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the loop's, not the job's
        workers.here(job(interrupted))
