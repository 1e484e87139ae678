"""Ports for servers whose address must be known before they start.

A fleet's links are told their node's port before the node runs, so the launcher picks the port
first and the node binds it later. A port taken with ``bind(0)`` comes from the kernel's
ephemeral range, and in the gap another socket (a link listening on port 0, any outgoing
connection) can be handed the same one. ``pick_port`` draws from below that range instead,
where the kernel never hands out ports by itself, and never gives one port out twice in one
process.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from tierlink.errors import NoFreePort

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768
LOWEST_PORT = 10000
MAX_TRIES = 200

_handed_out: set[int] = set()


def ephemeral_low(range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The lowest port the kernel hands out for ``bind(0)`` and outgoing connections."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def pick_port(host: str = "127.0.0.1", rng: random.Random | None = None,
              low: int | None = None) -> int:
    """A port that is free now on ``host``, outside the ephemeral range, new to this process."""
    draw = rng or random.Random()
    high = (ephemeral_low() if low is None else low) - 1
    if high <= LOWEST_PORT:  # a machine whose ephemeral range starts low: fall back to bind(0)
        return _kernel_port(host)
    for _ in range(MAX_TRIES):
        port = draw.randint(LOWEST_PORT, high)
        if port not in _handed_out and _bindable(host, port):
            _handed_out.add(port)
            return port
    raise NoFreePort(f"no free port in {LOWEST_PORT}-{high} on {host} after {MAX_TRIES} tries",
                     host=host)


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
