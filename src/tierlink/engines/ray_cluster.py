"""A local Ray cluster for a fleet's ``engine: ray`` nodes: started by `tierlink up`, and
stopped — exactly what it started, never `ray stop` (which ends every Ray process on the
machine).

``ray start --head --block`` runs in a session of its own; every process of the cluster
(GCS, raylet, dashboard agent, workers, Serve's controller and replicas) is in that
session's process group, so stopping is: SIGTERM to the group, SIGKILL to what is left after
``grace_s``. A worker node (``ray start --address HEAD --block``) is the same, and may run
in a network namespace (tests/integration/test_ray_engine.py: a two-node cluster across
namespaces).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tierlink.errors import TierlinkError
from tierlink.netports import DEFAULT_EPHEMERAL_LOW, LOWEST_PORT, pick_port

OBJECT_STORE_BYTES = 128 * 2**20  # the default (30% of memory) is far too much for a node


class RayClusterError(TierlinkError):
    code = "ray_cluster_error"
    hint = "see the ray-head log in the run directory; Ray needs `pip install tierlink[ray]`"


def ray_env() -> dict[str, str]:
    """The environment every process of the cluster (and its drivers) shares."""
    # Ray runs its workers at nice 15 by default: replicas serving a latency-bound tier
    # would then lose every CPU contest with the node that waits on them.
    return dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1",
                RAY_worker_niceness="0")


def head_command(host: str, port: int, num_cpus: float,
                 object_store_bytes: int = OBJECT_STORE_BYTES) -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            "--port", str(port), "--node-ip-address", host, "--num-cpus", f"{num_cpus:g}",
            "--include-dashboard=false", "--disable-usage-stats",
            "--ray-client-server-port", str(pick_port(host)),
            "--object-store-memory", str(object_store_bytes), *_ports(host)]


def worker_command(head: str, host: str, num_cpus: float,
                   object_store_bytes: int = OBJECT_STORE_BYTES) -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
            "--address", head, "--node-ip-address", host, "--num-cpus", f"{num_cpus:g}",
            "--disable-usage-stats", "--object-store-memory", str(object_store_bytes),
            *_ports(host)]


def _ports(host: str) -> list[str]:
    """Ray's fixed default ports (worker range 10002-19999, the agent's 52365) would
    collide with a fleet's own ports and with a second cluster: workers take ports the
    kernel hands out, the agent one picked for it."""
    return ["--min-worker-port", "0", "--max-worker-port", "0",
            "--dashboard-agent-listen-port", str(_port_on(host))]


def _port_on(host: str) -> int:
    """A free port on ``host`` when it is an address of this namespace; any port below the
    ephemeral range otherwise (a worker started in a namespace of its own, where nothing
    else listens)."""
    try:
        with socket.socket() as probe:
            probe.bind((host, 0))
    except OSError:
        return random.randint(LOWEST_PORT, DEFAULT_EPHEMERAL_LOW - 1)
    return pick_port(host)


def start(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=ray_env(),
                                start_new_session=True)


def wait_listening(host: str, port: int, proc: subprocess.Popen[bytes],
                   timeout_s: float = 60.0) -> None:
    """Until the head's GCS accepts connections."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RayClusterError(f"the Ray head exited with code {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RayClusterError(f"the Ray head did not listen on {host}:{port} in {timeout_s:g} s")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """End the process group ``proc`` leads: what this ``ray start`` started, nothing else.
    SIGTERM, then SIGKILL to what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie would keep its group "alive"
            if not _group_alive(proc.pid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
