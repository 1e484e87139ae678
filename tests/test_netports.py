"""Ports picked before the server starts: outside the ephemeral range, never twice, free now."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from tierlink.errors import NoFreePort
from tierlink.netports import LOWEST_PORT, ephemeral_low, pick_port


class FixedDraw(random.Random):
    """Draws the given ports in turn, then the last one forever."""

    def __init__(self, *ports: int) -> None:
        super().__init__(0)
        self.ports = list(ports)

    def randint(self, a: int, b: int) -> int:
        return self.ports.pop(0) if len(self.ports) > 1 else self.ports[0]


def test_ports_come_from_below_the_ephemeral_range() -> None:
    low = ephemeral_low()
    ports = [pick_port(rng=random.Random(seed)) for seed in range(20)]
    assert all(LOWEST_PORT <= p < low for p in ports)
    assert len(set(ports)) == len(ports)


def test_a_port_is_never_handed_out_twice_in_one_process() -> None:
    # the first free one of these (an earlier test in this process may hold one of them)
    first = pick_port(rng=FixedDraw(*range(20011, 20011 + 150)))
    with pytest.raises(NoFreePort, match="no free port"):
        pick_port(rng=FixedDraw(first))


def test_a_port_in_use_is_skipped() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        port = pick_port(rng=FixedDraw(taken, 20023), low=65000)
    assert port == 20023


def test_a_low_ephemeral_range_falls_back_to_the_kernel() -> None:
    assert 0 < pick_port(low=LOWEST_PORT) < 65536


def test_ephemeral_low_reads_the_kernel_setting(tmp_path: Path) -> None:
    good = tmp_path / "range"
    good.write_text("40000\t60999\n")
    assert ephemeral_low(good) == 40000
    bad = tmp_path / "bad"
    bad.write_text("")
    assert ephemeral_low(bad) == 32768
    assert ephemeral_low(tmp_path / "missing") == 32768
