"""A full disk under the outbox (a real one: a 2 MiB tmpfs): results that need the outbox
are refused with a clear 503 naming the disk, every result accepted before stays, survives
a restart of the uplink, and is delivered once there is room and the parent answers."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from uplink_support import FakeClock, FakeUpstream, make_uplink, until

from tierlink.core.types import Outcome, Tier
from tierlink.errors import OutboxError
from tierlink.node.async_requests import AsyncResults

OUTPUTS = {"probabilities": np.full((4, 10), 0.1, np.float32),
           "label": np.zeros(4, np.int64)}
OUTCOME = Outcome("dev-1", Tier.DEVICE, "fmnist-small", ("dev-1",), 0.7)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB filesystem of its own, unmounted afterwards (root, as in CI)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    assert mounted.returncode == 0, f"cannot mount a tmpfs (run as root): {mounted.stderr}"
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_refuses_new_results_and_loses_none_accepted(small_disk: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    upstream.down = True
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 768 * 1024)  # room to free once the disk is full

    async def fill() -> tuple[int, OutboxError]:
        uplink = make_uplink(small_disk, upstream)
        results = AsyncResults(uplink, clock=upstream.clock)
        accepted = 0
        try:
            for i in range(100_000):
                try:
                    await results.accept(f"r{i}", "fmnist", OUTPUTS, OUTCOME, 1.0)
                except OutboxError as exc:
                    return accepted, exc
                accepted += 1
            raise AssertionError("the disk never filled")
        finally:
            await uplink.stop()

    accepted, refused = asyncio.run(fill())
    assert accepted > 20
    assert refused.http_status == 503 and "disk" in (refused.message + (refused.hint or ""))

    async def deliver() -> list[str]:
        uplink = make_uplink(small_disk, upstream)  # a restart: the same state directory
        try:
            assert uplink.outbox.pending() == accepted  # every accepted result is still there
            filler.unlink()  # room again
            upstream.down = False
            uplink.start()
            await until(lambda: len(upstream.applied) == accepted, timeout_s=30.0)
            return list(upstream.applied)
        finally:
            await uplink.stop()

    applied = asyncio.run(deliver())
    assert sorted(applied) == sorted(f"dev-1:r{i}" for i in range(accepted))
