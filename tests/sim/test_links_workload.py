"""Simulated links (bandwidth queue, propagation, loss, outages) and arrival processes."""

from __future__ import annotations

import asyncio
import random

import pytest

from tierlink.fleet.workload import make_workload
from tierlink.sim.dispatch import Chain
from tierlink.sim.links import LinkShape, SimLink, outage_windows
from tierlink.sim.loop import run
from tierlink.sim.workload import Arrivals, Burst, arrival_times, workload


def _carry(shape: LinkShape, sizes: list[int], start: float = 0.0) -> list[float]:
    """When each payload sent at ``start`` is through (sent in order, at once)."""
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        link = SimLink("a", "b", shape, random.Random(1))
        await asyncio.sleep(start)
        through: list[asyncio.Future[float]] = []
        for n in sizes:
            future: asyncio.Future[float] = loop.create_future()
            link.send(n, lambda f=future: f.set_result(loop.time()), Chain())
            through.append(future)
        return list(await asyncio.gather(*through))

    return run(main)


def test_a_payload_cancelled_with_its_operation_never_arrives() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        link = SimLink("a", "b", LinkShape(20.0, outages=outage_windows([[0.0, 1.0]])),
                       random.Random(1))
        arrived: list[str] = []
        waiting, travelling = Chain(), Chain()
        link.send(100, lambda: arrived.append("waiting"), waiting)  # held by the outage
        await asyncio.sleep(1.001)
        link.send(100, lambda: arrived.append("travelling"), travelling)
        waiting.cancel()
        travelling.cancel()
        link.send(100, lambda: arrived.append("kept"), Chain())
        await asyncio.sleep(1.0)
        assert loop.time() > 2.0
        return arrived

    assert run(main) == ["kept"]


def test_propagation_and_a_bottleneck_queue() -> None:
    # 1 MB at 80 Mbit/s: 0.1 s on the wire, then half of a 20 ms RTT
    assert _carry(LinkShape(20.0, 80.0), [1_000_000]) == [pytest.approx(0.11)]
    # two at once: the second waits for the first's bytes
    assert _carry(LinkShape(20.0, 80.0), [1_000_000, 1_000_000]) == [
        pytest.approx(0.11), pytest.approx(0.21)]


def test_an_outage_holds_everything_until_the_link_is_back() -> None:
    shape = LinkShape(10.0, outages=outage_windows([[1.0, 3.0]]))
    assert _carry(shape, [100], start=1.5) == [pytest.approx(3.005)]
    with pytest.raises(ValueError):
        outage_windows([[3.0, 1.0]])


def test_a_lost_packet_costs_a_retransmission_timeout() -> None:
    assert _carry(LinkShape(10.0, loss=1.0), [100]) == [pytest.approx(0.205)]


def test_poisson_diurnal_and_bursts_have_the_rates_asked() -> None:
    rng = random.Random(3)
    poisson = arrival_times(Arrivals("poisson", 50.0), 200.0, rng)
    assert len(poisson) == pytest.approx(10_000, rel=0.05)
    day = arrival_times(Arrivals("diurnal", 50.0, amplitude=0.6, period_s=200.0), 200.0, rng)
    night = sum(t < 20 or t > 180 for t in day) / 40
    noon = sum(80 < t < 120 for t in day) / 40
    assert night == pytest.approx(20.0, rel=0.25) and noon == pytest.approx(80.0, rel=0.15)
    burst = arrival_times(Arrivals("poisson", 10.0, bursts=(Burst(10, 20, 5.0),)), 30.0, rng)
    assert sum(10 <= t < 20 for t in burst) > 3 * sum(t < 10 for t in burst)


def test_a_steady_workload_is_the_demos() -> None:
    steady = workload(Arrivals("constant", 25.0), 24.0, ["d1", "d2"], 100, seed=7)
    assert steady == make_workload(600, 25.0, ["d1", "d2"], 100, 7)
    again = workload(Arrivals("poisson", 25.0), 24.0, ["d1", "d2"], 100, seed=7)
    assert again == workload(Arrivals("poisson", 25.0), 24.0, ["d1", "d2"], 100, seed=7)


def test_a_degraded_window_lengthens_the_delay() -> None:
    shape = LinkShape(10.0, slow=((1.0, 2.0, 8.0),))
    assert _carry(shape, [100], start=1.5) == [pytest.approx(1.54)]
    assert _carry(shape, [100], start=2.5) == [pytest.approx(2.505)]
