"""Fault case (b): the device's uplink is down while it answers asynchronous requests, the
device is killed -9 during the outage and restarted; once the edge is up, every result
reaches the control plane exactly once, relayed by the edge, each saying the uplink was down.

Real processes on loopback, nothing else of a fleet (see ``store_forward_procs.py``): a
control plane with the result routes, an edge with the inbox route, a device. The edge's
port is bound by the test before any edge exists, so the device's uplink is refused
(connection refused: the link is down) until the edge starts listening on it.
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

PROCS = Path(__file__).with_name("store_forward_procs.py")
N = 60  # results answered by the device while its uplink is down


class Proc:
    """A started driver process whose stdout lines a thread reads into a queue."""

    def __init__(self, *args: str, pass_fds: tuple[int, ...] = ()) -> None:
        self.popen = subprocess.Popen([sys.executable, str(PROCS), *args],
                                      stdout=subprocess.PIPE, text=True, bufsize=1,
                                      pass_fds=pass_fds)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, predicate: Callable[[str], bool], timeout_s: float = 30.0) -> str:
        """The first line from now on that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no such line within {timeout_s} s; seen: "
                                     f"{self.seen[-5:]}") from None
            if line is None:
                raise AssertionError(f"process ended (rc {self.popen.wait()}) first")
            self.seen.append(line)
            if predicate(line):
                return line

    def kill9(self) -> list[str]:
        """SIGKILL, then every line it printed."""
        self.popen.kill()
        self.popen.wait(10)
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        return self.seen


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:  # only what this test started
        if p.popen.poll() is None:
            p.popen.kill()
        p.popen.wait(10)
        if p.popen.stdout is not None:
            p.popen.stdout.close()
    left = [p.popen.pid for p in started if p.popen.poll() is None]
    assert not left, f"driver processes still running: {left}"


@pytest.fixture
def edge_socket() -> Iterator[socket.socket]:
    """A loopback port for the edge, bound but not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.set_inheritable(True)
    yield sock
    sock.close()


def wait_port(ready: Path, proc: Proc, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        assert proc.popen.poll() is None, f"{ready.name}: process exited {proc.popen.poll()}"
        assert time.monotonic() < deadline, f"{ready.name} not written in {timeout_s} s"
        time.sleep(0.02)
    return int(json.loads(ready.read_text())["port"])


def poll(read: Callable[[], Any], done: Callable[[Any], bool], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"not done within {timeout_s} s: {value!r}"
        time.sleep(0.05)


def ids(lines: list[str], tag: str) -> list[str]:
    """Request ids of the complete ``tag`` lines (a kill may cut the last one)."""
    return [p[1] for p in (line.split() for line in lines)
            if len(p) >= 2 and p[0] == tag and len(p[1]) == 5]


def all_results(control: httpx.Client) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = control.get("/v1/results", params={"after": after, "limit": 1000}).json()
        rows += page["results"]
        after = page["next_after"]
    return rows


def test_results_cross_a_dead_uplink_and_a_kill9_exactly_once(
        tmp_path: Path, procs: list[Proc], edge_socket: socket.socket) -> None:
    device_state, edge_state = str(tmp_path / "dev-1"), str(tmp_path / "edge-1")
    control = Proc("control", str(tmp_path / "control.db"), str(tmp_path / "control.ready"))
    procs.append(control)
    control_url = f"http://127.0.0.1:{wait_port(tmp_path / 'control.ready', control)}"
    edge_url = f"http://127.0.0.1:{edge_socket.getsockname()[1]}"

    # 1. The device answers while its edge is down, and is killed -9 half way.
    first = Proc("device", device_state, edge_url, "0", str(N))
    procs.append(first)
    for _ in range(N // 2):
        first.wait_for(lambda s: s.startswith("ACCEPTED"))
    lines = first.kill9()

    # 2. Restarted on the same state: it answers the rest (from the request it was killed
    # at: a retried id is accepted again and stored once), still without an edge.
    resume = int(ids(lines, "TRY")[-1][1:])
    second = Proc("device", device_state, edge_url, str(resume), str(N), "--drain")
    procs.append(second)
    second.wait_for(lambda s: s == "QUEUED")
    http = httpx.Client(base_url=control_url, timeout=10, trust_env=False)
    assert all_results(http) == []  # nothing got through the dead uplink

    # 3. The edge comes up on the port the device has been trying.
    edge = Proc("edge", edge_state, control_url, str(tmp_path / "edge.ready"),
                str(edge_socket.fileno()), pass_fds=(edge_socket.fileno(),))
    procs.append(edge)
    wait_port(tmp_path / "edge.ready", edge)
    assert second.wait_for(lambda s: s.startswith("STATE")) == "STATE up"
    second.wait_for(lambda s: s == "DRAINED")
    lines += second.seen
    rows = poll(lambda: all_results(http), lambda r: len(r) >= N)
    edge_http = httpx.Client(base_url=f"{edge_url}", timeout=10, trust_env=False)
    poll(lambda: edge_http.get("/status").json()["outbox"]["items"], lambda n: n == 0)

    expected = {f"dev-1:r{i:04d}" for i in range(N)}
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)) == N and set(keys) == expected  # all, each once
    assert {f"dev-1:{i}" for i in ids(lines, "ACCEPTED")} <= set(keys)
    assert all(r["chain"] == ["dev-1", "edge-1"] and r["kind"] == "result" for r in rows)
    by_key = {r["key"]: r["payload"] for r in rows}
    after_restart = [i for i in ids(second.seen, "ACCEPTED") if i != f"r{resume:04d}"]
    assert after_restart and all(by_key[f"dev-1:{i}"]["uplink"] == "down"
                                 for i in after_restart)  # each result says so
    metrics = http.get("/metrics").text
    assert f'tierlink_control_results_total{{outcome="stored"}} {float(N)}' in metrics
    http.close()
    edge_http.close()


def test_a_dead_parent_s_line_goes_through_the_next_upstream(
        tmp_path: Path, procs: list[Proc], edge_socket: socket.socket) -> None:
    """The device's first upstream never listens; its results reach the control plane
    through its second upstream, each once, with that edge in their chain."""
    control = Proc("control", str(tmp_path / "control.db"), str(tmp_path / "control.ready"))
    procs.append(control)
    control_url = f"http://127.0.0.1:{wait_port(tmp_path / 'control.ready', control)}"
    live = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    live.bind(("127.0.0.1", 0))
    live.set_inheritable(True)
    try:
        edge2 = Proc("edge", str(tmp_path / "edge-2"), control_url,
                     str(tmp_path / "edge2.ready"), str(live.fileno()), "edge-2",
                     pass_fds=(live.fileno(),))
        procs.append(edge2)
        wait_port(tmp_path / "edge2.ready", edge2)
        dead_url = f"http://127.0.0.1:{edge_socket.getsockname()[1]}"
        live_url = f"http://127.0.0.1:{live.getsockname()[1]}"
        device = Proc("device", str(tmp_path / "dev-1"), dead_url, "0", "20", "--drain",
                      "--fallback", live_url)
        procs.append(device)
        assert device.wait_for(lambda s: s.startswith("STATE")) == "STATE up"
        device.wait_for(lambda s: s == "DRAINED")
        http = httpx.Client(base_url=control_url, timeout=10, trust_env=False)
        rows = poll(lambda: all_results(http), lambda r: len(r) >= 20)
        http.close()
    finally:
        live.close()
    assert sorted(r["key"] for r in rows) == [f"dev-1:r{i:04d}" for i in range(20)]
    assert all(r["chain"] == ["dev-1", "edge-2"] for r in rows)
