"""Simulated time: sleeps and timeouts cost no wall time, and a run that can never finish
says so instead of hanging."""

from __future__ import annotations

import asyncio
import time

import pytest

from tierlink.sim.loop import SimulationStalled, run


def test_an_hour_of_sleeps_takes_no_time() -> None:
    async def main() -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()

        async def at(delay: float) -> float:
            await asyncio.sleep(delay)
            return loop.time()

        times = await asyncio.gather(at(3600.0), at(0.5), at(60.0))
        try:
            await asyncio.wait_for(asyncio.sleep(10.0), 2.0)
        except TimeoutError:
            pass
        return list(times), loop.time()

    wall = time.perf_counter()
    times, end = run(main)
    assert times == [3600.0, 0.5, 60.0] and end == pytest.approx(3602.0)
    assert time.perf_counter() - wall < 1.0


def test_waiting_forever_is_an_error_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimulationStalled):
        run(main)


def test_the_collector_is_held_back_during_a_run_and_restored_after() -> None:
    import gc

    before = gc.get_threshold()

    async def main() -> tuple[int, int]:
        return gc.get_threshold()[0], gc.get_freeze_count()

    during, frozen = run(main)
    assert during >= 100_000 and frozen > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0

    async def never() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimulationStalled):
        run(never)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_timers_due_together_run_in_the_order_set_and_cancelled_ones_never() -> None:
    async def main() -> tuple[list[int], float]:
        loop = asyncio.get_running_loop()
        ran: list[int] = []
        handles = [loop.call_at(1.0, ran.append, i) for i in range(300)]
        for i, h in enumerate(handles):  # two in three: the loop compacts its timers
            if i % 3:
                h.cancel()
        await asyncio.sleep(2.0)
        return ran, loop.time()

    ran, end = run(main)
    assert ran == list(range(0, 300, 3)) and end == 2.0
