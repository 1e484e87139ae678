"""A Link in front of a loopback echo server: delay, bandwidth, order, cut, update, loss."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from netem_support import connect, echo_server, link_to, ping, run, sink_server

from tierlink.errors import LinkEmulationError
from tierlink.netem.link import MIN_RTO_S, DeliveryTimer, Link


async def _rtts(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> list[float]:
    return [await ping(reader, writer) for _ in range(n)]


def test_rtt_is_twice_the_one_way_delay() -> None:
    async def scenario() -> tuple[float, float]:
        async with echo_server() as port, link_to(port, delay_ms=20) as link:
            reader, writer = await connect(link)
            first = await ping(reader, writer)  # includes the emulated handshake RTT
            rtts = await _rtts(reader, writer, 10)
            writer.close()
            return first, statistics.median(rtts)

    first, rtt = run(scenario())
    assert 0.030 <= rtt <= 0.050
    assert 0.070 <= first <= 0.100  # a new connection pays one extra RTT, as TCP's handshake


def test_bandwidth_serialises_bytes() -> None:
    size = 2_000_000  # at 10 Mbit/s: 1.6 s

    async def scenario() -> float:
        async with sink_server(size) as port, link_to(port, bandwidth_mbit=10) as link:
            reader, writer = await connect(link)
            start = time.perf_counter()
            writer.write(b"x" * size)
            await writer.drain()
            assert await reader.readexactly(2) == b"OK"
            writer.close()
            assert link.counters.bytes_forward == size
            return time.perf_counter() - start

    elapsed = run(scenario())
    assert 1.6 * 0.75 <= elapsed <= 1.6 * 1.25


def test_jitter_never_reorders_bytes() -> None:
    async def scenario() -> tuple[bytes, bytes, list[float]]:
        async with echo_server() as port, link_to(port, delay_ms=5, jitter_ms=5) as link:
            reader, writer = await connect(link)
            await ping(reader, writer)  # past the handshake
            sent = b"".join(f"{i:05d};".encode() for i in range(200))
            for i in range(0, len(sent), 30):  # many separate chunks, each with its own jitter
                writer.write(sent[i:i + 30])
                await writer.drain()
                await asyncio.sleep(0.001)
            received = await reader.readexactly(len(sent))
            rtts = await _rtts(reader, writer, 15)
            writer.close()
            return sent, received, rtts

    sent, received, rtts = run(scenario())
    assert received == sent
    assert max(rtts) - min(rtts) > 0.003  # the jitter is really there
    assert all(0.0 <= r <= 0.040 for r in rtts)  # 2 x (5 + 5) ms at most, plus slack


def test_cut_resets_connections_and_back_up_accepts_again() -> None:
    async def scenario() -> None:
        async with echo_server() as port, link_to(port) as link:
            reader, writer = await connect(link)
            await ping(reader, writer)
            start = time.perf_counter()
            link.update(up=False)
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await ping(reader, writer)
            new_reader, new_writer = await connect(link)
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await ping(new_reader, new_writer)
            assert time.perf_counter() - start < 0.5
            assert (link.counters.resets, link.counters.refused) == (1, 1)
            writer.close()
            new_writer.close()
            link.update(up=True)
            reader, writer = await connect(link)
            assert await ping(reader, writer) < 0.5
            writer.close()

    run(scenario())


def test_runtime_update_changes_the_delay_of_new_chunks() -> None:
    async def scenario() -> tuple[float, float]:
        async with echo_server() as port, link_to(port, delay_ms=5) as link:
            reader, writer = await connect(link)
            await ping(reader, writer)
            before = statistics.median(await _rtts(reader, writer, 5))
            link.update(delay_ms=30)
            after = statistics.median(await _rtts(reader, writer, 5))
            writer.close()
            return before, after

    before, after = run(scenario())
    assert 0.005 <= before <= 0.025
    assert 0.055 <= after <= 0.080


def test_loss_pays_one_retransmission_timeout_per_lost_chunk() -> None:
    pings = 12

    async def scenario() -> tuple[list[float], int, int]:
        async with echo_server() as port, link_to(port, seed=7, loss=0.25) as link:
            reader, writer = await connect(link)
            rtts = await _rtts(reader, writer, pings)
            writer.close()
            chunks = link.counters.chunks_forward + link.counters.chunks_reverse
            return rtts, link.counters.chunks_lost, chunks

    rtts, lost, chunks = run(scenario())
    assert chunks == 2 * pings
    # Each ping is two chunks; each lost chunk costs one RTO (200 ms at this tiny RTT).
    timeouts = sum(round(r / MIN_RTO_S) for r in rtts)
    assert timeouts == lost
    assert 1 <= lost <= 12  # 24 chunks at p = 0.25: expected 6; the seed makes it exact


def test_unreachable_target_resets_the_client() -> None:
    async def scenario() -> int:
        async with echo_server() as port:
            pass  # the port is free again: nothing listens there
        async with link_to(port) as link:
            reader, writer = await connect(link)
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await ping(reader, writer)
            writer.close()
            return link.counters.connect_errors

    assert run(scenario()) == 1


def test_stop_closes_open_connections() -> None:
    async def scenario() -> None:
        async with echo_server() as port:
            async with link_to(port) as link:
                reader, writer = await connect(link)
                await ping(reader, writer)
                assert link.counters.active == 1
            assert link.counters.active == 0
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await ping(reader, writer)
            writer.close()

    run(scenario())


def test_update_rejects_fixed_fields_and_bad_values() -> None:
    async def scenario() -> None:
        async with echo_server() as port, link_to(port, delay_ms=5) as link:
            with pytest.raises(LinkEmulationError, match="target_port"):
                link.update(target_port=1)
            with pytest.raises(LinkEmulationError, match="loss"):
                link.update(loss=1.5)
            assert link.spec.delay_ms == 5 and link.spec.loss == 0

    run(scenario())


def test_connections_share_the_link_bandwidth() -> None:
    size = 1_000_000  # two of them at 10 Mbit/s: 1.6 s together, not 0.8 s each

    async def send(link: Link) -> None:
        reader, writer = await connect(link)
        writer.write(b"x" * size)
        await writer.drain()
        assert await reader.readexactly(2) == b"OK"
        writer.close()

    async def scenario() -> float:
        async with sink_server(size) as port, link_to(port, bandwidth_mbit=10) as link:
            start = time.perf_counter()
            await asyncio.gather(send(link), send(link))
            return time.perf_counter() - start

    elapsed = run(scenario())
    assert 1.6 * 0.8 <= elapsed <= 1.6 * 1.25


def test_delivery_timer_learns_its_lateness() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        timer = DeliveryTimer(early_s=0.0)
        await timer.sleep_until(loop.time() - 1.0)  # already due: returns at once
        assert timer.early_s == 0.0
        await timer.sleep_until(loop.time() + 0.002)  # a wake-up is never early at aim 0
        assert timer.early_s == DeliveryTimer.STEP_S

    run(scenario())
