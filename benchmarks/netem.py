"""How faithfully the user-space link emulator reproduces declared delay and bandwidth.

Starts ``python -m tierlink.netem.server`` as its own process (as a fleet does) with two links:
``ping`` in front of an echo server and ``bulk`` in front of a sink, both in this process. For
each (one-way delay, bandwidth) pair it sets both links through the control API, then measures

* RTT: p50 / p99 over ``--pings`` 64-byte echoes on one warm connection (declared: 2 x delay);
* throughput: one ``--mbytes`` MB transfer to the sink, timed from the first byte sent to the
  sink's acknowledgement, minus the measured RTT p50 (the last byte's trip and the ack's).

A first row with no delay and no bandwidth limit shows the proxy's own overhead.

    python benchmarks/netem.py [--json results.json] [--pings 200] [--mbytes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tierlink.netem.link import LinkSpec
from tierlink.netem.server import EmulatorReady, LinkControlClient, read_ready_file

PING_BYTES = 64
HEADER_BYTES = 8


@dataclass(frozen=True)
class Row:
    delay_ms: float
    bandwidth_mbit: float | None
    declared_rtt_ms: float
    rtt_p50_ms: float
    rtt_p99_ms: float
    transfer_bytes: int
    transfer_s: float
    throughput_mbit: float

    @property
    def throughput_error(self) -> float | None:
        if self.bandwidth_mbit is None:
            return None
        return self.throughput_mbit / self.bandwidth_mbit - 1.0


# --- loopback servers (in this process) ----------------------------------------------------


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Protocol: 8-byte big-endian length -> b"R"; then that many bytes -> b"OK"."""
    try:
        size = int.from_bytes(await reader.readexactly(HEADER_BYTES), "big")
        writer.write(b"R")
        await writer.drain()
        remaining = size
        while remaining:
            chunk = await reader.read(min(remaining, 1 << 20))
            if not chunk:
                return
            remaining -= len(chunk)
        writer.write(b"OK")
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


@asynccontextmanager
async def _servers() -> AsyncIterator[tuple[int, int]]:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    sink = await asyncio.start_server(_sink, "127.0.0.1", 0)
    try:
        yield (echo.sockets[0].getsockname()[1], sink.sockets[0].getsockname()[1])
    finally:
        echo.close()
        sink.close()


# --- the emulator process ------------------------------------------------------------------


@contextmanager
def _emulator(specs: list[LinkSpec], workdir: Path) -> Iterator[EmulatorReady]:
    spec_file, ready_file = workdir / "links.json", workdir / "ready.json"
    spec_file.write_text(json.dumps([s.to_dict() for s in specs]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierlink.netem.server", "--spec", str(spec_file),
         "--ready-file", str(ready_file), "--seed", "1", "--log-level", "WARNING"])
    try:
        yield _wait_ready(proc, ready_file)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], ready_file: Path) -> EmulatorReady:
    deadline = time.monotonic() + 60
    while not ready_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the link emulator did not start (exit code {proc.poll()})")
        time.sleep(0.05)
    return read_ready_file(ready_file)


# --- measurements --------------------------------------------------------------------------


async def _rtts(port: int, pings: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = b"p" * PING_BYTES
    samples = []
    try:
        for i in range(pings + 1):
            start = time.perf_counter()
            writer.write(payload)
            await writer.drain()
            await reader.readexactly(PING_BYTES)
            if i:  # the first one pays the emulated handshake
                samples.append(time.perf_counter() - start)
    finally:
        writer.close()
    return samples


async def _transfer(port: int, size: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    block = b"x" * (1 << 20)
    try:
        writer.write(size.to_bytes(HEADER_BYTES, "big"))
        await reader.readexactly(1)  # past the handshake: time only the bytes
        start = time.perf_counter()
        for offset in range(0, size, len(block)):
            writer.write(block[:min(len(block), size - offset)])
            await writer.drain()
        await reader.readexactly(2)
        return time.perf_counter() - start
    finally:
        writer.close()


async def _measure(ready: EmulatorReady, client: LinkControlClient, delay_ms: float,
                   bandwidth_mbit: float | None, pings: int, size: int) -> Row:
    for name in ("ping", "bulk"):
        await asyncio.to_thread(client.update, name, delay_ms=delay_ms,
                                bandwidth_mbit=bandwidth_mbit)
    rtts = sorted(await _rtts(ready.link_ports["ping"], pings))
    p50 = statistics.median(rtts)
    p99 = rtts[min(len(rtts) - 1, round(0.99 * (len(rtts) - 1)))]
    elapsed = await _transfer(ready.link_ports["bulk"], size)
    return Row(delay_ms=delay_ms, bandwidth_mbit=bandwidth_mbit, declared_rtt_ms=2 * delay_ms,
               rtt_p50_ms=p50 * 1e3, rtt_p99_ms=p99 * 1e3, transfer_bytes=size,
               transfer_s=elapsed, throughput_mbit=size * 8 / max(elapsed - p50, 1e-9) / 1e6)


async def _run(args: argparse.Namespace, workdir: Path) -> list[Row]:
    grid: list[tuple[float, float | None]] = [(0.0, None)]
    grid += [(d, b) for d in args.delays for b in args.bandwidths]
    async with _servers() as (echo_port, sink_port):
        specs = [LinkSpec(name="ping", target_host="127.0.0.1", target_port=echo_port),
                 LinkSpec(name="bulk", target_host="127.0.0.1", target_port=sink_port)]
        with _emulator(specs, workdir) as ready, LinkControlClient(ready.control_url) as client:
            rows = []
            for delay_ms, bandwidth in grid:
                rows.append(await _measure(ready, client, delay_ms, bandwidth, args.pings,
                                           int(args.mbytes * 1e6)))
                _progress(rows[-1])
            return rows


def _progress(row: Row) -> None:
    print(f"  delay {row.delay_ms:g} ms, bandwidth {row.bandwidth_mbit or 'unlimited'}: "
          f"rtt p50 {row.rtt_p50_ms:.2f} ms, {row.throughput_mbit:.2f} Mbit/s", file=sys.stderr)


# --- output --------------------------------------------------------------------------------


def _table(rows: list[Row]) -> Any:
    from rich.table import Table

    table = Table(title="tierlink link emulator: declared vs achieved")
    for column in ("one-way delay", "bandwidth", "declared RTT", "RTT p50", "RTT p99",
                   "RTT p50 error", "throughput", "throughput error"):
        table.add_column(column, justify="right")
    for row in rows:
        thr_error = row.throughput_error
        table.add_row(
            f"{row.delay_ms:g} ms",
            f"{row.bandwidth_mbit:g} Mbit/s" if row.bandwidth_mbit else "unlimited",
            f"{row.declared_rtt_ms:g} ms", f"{row.rtt_p50_ms:.2f} ms", f"{row.rtt_p99_ms:.2f} ms",
            f"{row.rtt_p50_ms - row.declared_rtt_ms:+.2f} ms",
            f"{row.throughput_mbit:.2f} Mbit/s",
            f"{thr_error * 100:+.1f}%" if thr_error is not None else "-")
    return table


def _report(rows: list[Row], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "benchmark": "netem",
        "pings": args.pings, "transfer_mbytes": args.mbytes,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "rows": [{**asdict(r), "throughput_error": r.throughput_error} for r in rows],
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--delays", type=float, nargs="+", default=[5.0, 40.0],
                        help="one-way delays in ms")
    parser.add_argument("--bandwidths", type=float, nargs="+", default=[10.0, 50.0, 100.0],
                        help="bandwidths in Mbit/s")
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--mbytes", type=float, default=10.0, help="transfer size in MB")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    args = _parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tierlink-netem-bench-") as workdir:
        rows = asyncio.run(_run(args, Path(workdir)))
    Console(width=max(Console().width, 132)).print(_table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(_report(rows, args), indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
