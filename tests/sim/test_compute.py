"""The node's own scheduler with workers on simulated time: queueing, admission control,
expiry and learned service times behave as on a node."""

from __future__ import annotations

import asyncio
import random

import pytest

from tierlink.core.types import Priority
from tierlink.errors import AdmissionRefused, DeadlineExceeded
from tierlink.node.scheduler import Scheduler, SchedulerConfig
from tierlink.sim.compute import ComputeModel, Reply, SimScheduler, Work
from tierlink.sim.loop import run


def _scheduler(workers: int = 2, max_queue: int = 8) -> SimScheduler:
    loop = asyncio.get_running_loop()
    s = SimScheduler(SchedulerConfig(workers=workers, max_queue=max_queue), clock=loop.time)
    s.start()
    return s


def test_workers_run_jobs_in_parallel_on_simulated_time() -> None:
    async def main() -> tuple[list[float], float]:
        s, loop = _scheduler(), asyncio.get_running_loop()

        async def job(seconds: float) -> float:
            await s.submit(Work(seconds, "ok"), priority=Priority.BATCH, deadline_s=None,
                           key="m", inline=False)
            return loop.time()

        done = await asyncio.gather(job(1.0), job(1.0), job(1.0))
        return list(done), s.service_estimate_ms("m")

    done, learned = run(main)
    assert done == [1.0, 1.0, 2.0] and learned == pytest.approx(1000.0)
    assert issubclass(SimScheduler, Scheduler)  # the node's scheduler, not a twin


def test_admission_is_the_nodes() -> None:
    async def main() -> list[str]:
        s = _scheduler(workers=1, max_queue=1)
        s.seed_service_ms("m", 100.0)
        loop = asyncio.get_running_loop()

        async def job(deadline_ms: float | None, prio: Priority = Priority.BATCH) -> str:
            deadline = None if deadline_ms is None else loop.time() + deadline_ms / 1000
            try:
                await s.submit(Work(0.1), priority=prio, deadline_s=deadline, key="m",
                               inline=False)
            except AdmissionRefused as exc:
                return f"refused:{exc.details['reason']}"
            except DeadlineExceeded:
                return "expired"
            return "ok"

        first = asyncio.ensure_future(job(None))
        await asyncio.sleep(0)
        queued = asyncio.ensure_future(job(None))
        await asyncio.sleep(0)
        full = await job(None)
        done = await first  # the queued job now runs: 100 ms of work ahead
        late = await job(50.0)
        return [done, await queued, full, late]

    assert run(main) == ["ok", "ok", "refused:queue_full", "refused:deadline"]


def test_run_times_scale_with_speed_and_jitter_is_seeded() -> None:
    half = ComputeModel(speed=0.5, jitter=0.0)
    assert half.seconds(2.0, random.Random(1)) == pytest.approx(0.004)
    noisy = ComputeModel(jitter=0.3)
    draws = [noisy.seconds(10.0, random.Random(7)) for _ in range(2)]
    assert draws[0] == draws[1] and draws[0] != 0.01


def test_a_reply_comes_on_the_next_turn_and_a_cancelled_one_leaves_the_queue() -> None:
    async def main() -> tuple[list[tuple[str, float]], int]:
        s, loop = _scheduler(workers=1), asyncio.get_running_loop()
        heard: list[tuple[str, float]] = []

        def submit(name: str) -> Reply:
            reply = Reply(lambda result, error: heard.append((result, loop.time())), s)
            reply.job = s.admit(Work(1.0, name), priority=Priority.BATCH, deadline_s=None,
                                future=reply, key="m", inline=False)
            return reply

        submit("first")
        gone = submit("gone")  # queued behind the first
        submit("third")
        assert heard == []  # never inside the call that submitted it
        gone.cancel()
        await asyncio.sleep(5.0)
        return heard, s.snapshot().cancelled

    heard, cancelled = run(main)
    assert heard == [("first", 1.0), ("third", 2.0)] and cancelled == 1
