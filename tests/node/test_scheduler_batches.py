"""Dynamic batching in the scheduler: which waiting jobs run together, and which never do.

As in ``test_scheduler.py``: one worker held by a gate while jobs queue, a fake clock, no
sleeps to prove an order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from test_scheduler import (
    BATCH,
    IA,
    RT,
    FakeClock,
    Gate,
    make,
    occupy,
    run,
    until,
)

from tierlink.core.types import Priority
from tierlink.errors import DeadlineExceeded, RuntimeFailure
from tierlink.node.scheduler import Batchable, Scheduler


class Runs:
    """A batched call that records the items of every run and answers each item doubled."""

    def __init__(self, fail: bool = False) -> None:
        self.runs: list[list[int]] = []
        self.fail = fail

    def __call__(self, items: Sequence[Any]) -> list[Any]:
        self.runs.append(list(items))
        if self.fail:
            raise RuntimeFailure("the model failed")
        return [2 * item for item in items]

    def batchable(self, item: int, key: str = "m@1", limit: int = 8,
                  delay_s: float = 0.0) -> Batchable:
        return Batchable(key, item, self, limit, delay_s)


class Sizes:
    def __init__(self) -> None:
        self.batches: list[tuple[str, int, float]] = []

    def on_admit(self, *_: Any) -> None: ...
    def on_refuse(self, *_: Any) -> None: ...
    def on_start(self, *_: Any) -> None: ...
    def on_finish(self, *_: Any) -> None: ...
    def on_expire(self, *_: Any) -> None: ...

    def on_batch(self, key: str, size: int, held_s: float) -> None:
        self.batches.append((key, size, held_s))


def submit(sched: Scheduler, runs: Runs, item: int, *, priority: Priority = IA,
           deadline_s: float | None = None, **batch: Any) -> asyncio.Task[Any]:
    return asyncio.create_task(sched.submit(
        lambda: 2 * item, priority=priority, deadline_s=deadline_s, key="m",
        batch=runs.batchable(item, **batch)))


def test_jobs_waiting_together_run_as_one_batch_and_each_gets_its_answer() -> None:
    async def main() -> None:
        sizes = Sizes()
        sched, gate, runs = make(workers=1, observer=sizes), Gate(), Runs()
        blocker = await occupy(sched, gate)
        tasks = [submit(sched, runs, i) for i in range(5)]
        await until(lambda: sched.snapshot().queue_depth == 5)
        gate.release.set()
        assert await asyncio.gather(*tasks) == [0, 2, 4, 6, 8]
        await blocker
        assert runs.runs == [[0, 1, 2, 3, 4]]
        assert sizes.batches == [("m", 5, 0.0)]
        stats = sched.snapshot()
        assert (stats.completed, stats.inflight, stats.queue_depth) == (6, 0, 0)
        await sched.close()

    run(main)


def test_a_batch_takes_at_most_its_limit_and_never_mixes_keys() -> None:
    async def main() -> None:
        sched, gate, runs = make(workers=1), Gate(), Runs()
        blocker = await occupy(sched, gate)
        tasks = [submit(sched, runs, i, limit=3) for i in range(5)]
        tasks += [submit(sched, runs, 10 + i, key="other@1", limit=3) for i in range(2)]
        await until(lambda: sched.snapshot().queue_depth == 7)
        gate.release.set()
        assert await asyncio.gather(*tasks) == [0, 2, 4, 6, 8, 20, 22]
        await blocker
        assert runs.runs == [[0, 1, 2], [3, 4], [10, 11]]
        await sched.close()

    run(main)


def test_priorities_still_order_the_queue() -> None:
    async def main() -> None:
        sched, gate, runs = make(workers=1), Gate(), Runs()
        blocker = await occupy(sched, gate)
        tasks = [submit(sched, runs, 1, priority=BATCH, key="a@1"),
                 submit(sched, runs, 2, priority=RT, key="b@1"),
                 submit(sched, runs, 3, priority=BATCH, key="a@1")]
        await until(lambda: sched.snapshot().queue_depth == 3)
        gate.release.set()
        await asyncio.gather(*tasks, blocker)
        # the realtime job runs first, alone (its fn, not a batch of one); then the two
        assert runs.runs == [[1, 3]]
        await sched.close()

    run(main)


def test_a_job_joins_only_when_the_batch_keeps_every_deadline() -> None:
    """A realtime job with 25 ms left heads the queue; at 10 ms a job, a batch of two fits
    its deadline and a third would make it late: the others run after it, on their turn."""

    async def main() -> None:
        clock = FakeClock(0.0)
        sched, gate, runs = make(clock, workers=1), Gate(), Runs()
        sched.seed_service_ms("m", 10.0)
        blocker = await occupy(sched, gate)
        tasks = [submit(sched, runs, 0, priority=RT, deadline_s=0.025)]
        tasks += [submit(sched, runs, i, priority=BATCH) for i in range(1, 5)]
        await until(lambda: sched.snapshot().queue_depth == 5)
        gate.release.set()
        await asyncio.gather(*tasks, blocker)
        assert runs.runs[0] == [0, 1]
        assert sorted(i for r in runs.runs for i in r) == [0, 1, 2, 3, 4]
        await sched.close()

    run(main)


def test_an_expired_job_is_not_run_in_a_batch() -> None:
    async def main() -> None:
        clock = FakeClock(0.0)
        sched, gate, runs = (make(clock, workers=1, initial_service_ms=0.0, inline_below_ms=0),
                             Gate(), Runs())
        blocker = await occupy(sched, gate)
        first = submit(sched, runs, 1)
        late = submit(sched, runs, 2, deadline_s=0.010)
        last = submit(sched, runs, 3)
        await until(lambda: sched.snapshot().queue_depth == 3)
        clock.advance(0.020)
        gate.release.set()
        assert await first == 2 and await last == 6
        with pytest.raises(DeadlineExceeded):
            await late
        await blocker
        assert runs.runs == [[1, 3]]
        await sched.close()

    run(main)


def test_a_cancelled_job_leaves_the_batch() -> None:
    async def main() -> None:
        sched, gate, runs = make(workers=1), Gate(), Runs()
        blocker = await occupy(sched, gate)
        tasks = [submit(sched, runs, i) for i in range(3)]
        await until(lambda: sched.snapshot().queue_depth == 3)
        tasks[1].cancel()
        await until(lambda: sched.snapshot().queue_depth == 2)
        gate.release.set()
        assert [await tasks[0], await tasks[2]] == [0, 4]
        await blocker
        assert runs.runs == [[0, 2]]
        assert sched.snapshot().cancelled == 1
        await sched.close()

    run(main)


def test_a_failed_batch_fails_each_of_its_jobs_and_the_scheduler_goes_on() -> None:
    async def main() -> None:
        sched, gate, runs = make(workers=1), Gate(), Runs(fail=True)
        blocker = await occupy(sched, gate)
        tasks = [submit(sched, runs, i) for i in range(3)]
        await until(lambda: sched.snapshot().queue_depth == 3)
        gate.release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, RuntimeFailure) for r in results)
        await blocker
        assert sched.snapshot().failed == 3
        assert await sched.submit(lambda: 7, priority=IA, deadline_s=None) == 7
        await sched.close()

    run(main)


def test_a_free_worker_holds_a_job_up_to_its_delay_for_others_to_join() -> None:
    async def main() -> None:
        sizes = Sizes()
        sched, runs = make(workers=1, observer=sizes), Runs()
        first = submit(sched, runs, 1, limit=2, delay_s=5.0)
        await until(lambda: sched.snapshot().queue_depth == 1)  # held: the worker is free
        second = submit(sched, runs, 2, limit=2, delay_s=5.0)  # fills it: it runs at once
        assert [await first, await second] == [2, 4]
        assert runs.runs == [[1, 2]]
        assert [(key, size) for key, size, _ in sizes.batches] == [("m", 2)]
        await sched.close()

    run(main)


def test_a_held_job_runs_alone_when_its_delay_ends() -> None:
    async def main() -> None:
        sched, runs = make(workers=1), Runs()
        started = asyncio.get_running_loop().time()
        assert await submit(sched, runs, 1, delay_s=0.02) == 2
        assert asyncio.get_running_loop().time() - started >= 0.015
        assert runs.runs == []  # alone: its own fn ran
        await sched.close()

    run(main)


def test_a_realtime_job_is_never_held_for_a_batch() -> None:
    async def main() -> None:
        sched, runs = make(workers=1), Runs()
        task = submit(sched, runs, 1, priority=RT, delay_s=5.0)
        await until(task.done)
        assert task.result() == 2
        await sched.close()

    run(main)


def test_a_hold_never_outlasts_the_deadline_s_slack() -> None:
    """10 ms per job, a limit of 4 and 50 ms left: held at most 10 ms, never the 5 s."""

    async def main() -> None:
        clock = FakeClock(0.0)
        sched, runs = make(clock, workers=1), Runs()
        sched.seed_service_ms("m", 10.0)
        task = submit(sched, runs, 1, deadline_s=0.050, limit=4, delay_s=5.0)
        await until(lambda: sched.snapshot().queue_depth == 1)
        assert sched._queue.peek().hold_until == pytest.approx(0.010)
        task.cancel()
        await sched.close()

    run(main)
