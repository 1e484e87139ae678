"""The control plane as a real process on loopback: crash, cached view, restart, recovery."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tierlink.control.client import ControlClient, RegistryCache
from tierlink.errors import ControlPlaneError

pytestmark = pytest.mark.integration

Start = Callable[..., tuple[subprocess.Popen, int]]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Start]:
    """``start(db, port=0)`` runs ``python -m tierlink.control.server`` and waits until it
    is ready; every process started is killed (by pid) at teardown if still running."""
    started: list[subprocess.Popen] = []

    def start(db: Path, port: int = 0, ttl_s: float = 30.0) -> tuple[subprocess.Popen, int]:
        ready = tmp_path / f"ready-{len(started)}.json"
        log = (tmp_path / f"server-{len(started)}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tierlink.control.server", "--host", "127.0.0.1",
             "--port", str(port), "--db", str(db), "--ttl", str(ttl_s),
             "--ready-file", str(ready), "--open"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        started.append(proc)
        return proc, _wait_ready(proc, ready, Path(log.name))

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _wait_ready(proc: subprocess.Popen, ready: Path, log: Path, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None:
            pytest.fail(f"control plane exited with {proc.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"control plane not ready after {timeout_s} s:\n{log.read_text()}")
        time.sleep(0.02)
    return int(json.loads(ready.read_text())["port"])


def test_nodes_keep_their_view_while_the_control_plane_is_down(start_server, tmp_path,
                                                               make_body):
    db = tmp_path / "registry.db"
    first, port = start_server(db)
    url = f"http://127.0.0.1:{port}"
    body = make_body(started_at=time.time())

    async def before_crash(client: ControlClient, cache: RegistryCache) -> dict:
        await client.heartbeat(body)
        assert await cache.refresh() is True
        [node] = cache.nodes
        assert node["node_id"] == "edge-1" and node["generation"] == 1
        return node

    async def while_down(client: ControlClient, cache: RegistryCache, node: dict) -> None:
        assert await cache.refresh() is False
        assert cache.nodes == [node] and cache.failures == 1
        assert url in (cache.last_error or "")
        with pytest.raises(ControlPlaneError, match=f"{url}/v1/nodes/edge-1/heartbeat"):
            await client.heartbeat(body)

    async def after_restart(client: ControlClient, cache: RegistryCache, node: dict) -> None:
        await client.heartbeat(body)
        assert await cache.refresh() is True
        [again] = cache.nodes
        assert again["node_id"] == "edge-1" and again["last_seen"] > node["last_seen"]
        assert again["generation"] == 1  # same incarnation, back within the ttl
        assert cache.failures == 1 and cache.consecutive_failures == 0

    async def scenario() -> None:
        async with ControlClient(url, timeout_s=2.0) as client:
            cache = RegistryCache(client)
            node = await before_crash(client, cache)
            first.send_signal(signal.SIGKILL)  # a crash: no graceful shutdown
            first.wait(timeout=10)
            await while_down(client, cache, node)
            second, _ = start_server(db, port=port)  # same URL, same database
            await after_restart(client, cache, node)
            second.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(second.wait, 20) == 0  # clean exit
            assert not (tmp_path / "ready-1.json").exists()  # removed on the way out

    asyncio.run(scenario())


def test_a_busy_port_is_reported(start_server, tmp_path):
    _, port = start_server(tmp_path / "a.db")
    result = subprocess.run(
        [sys.executable, "-m", "tierlink.control.server", "--port", str(port),
         "--db", str(tmp_path / "b.db")],
        check=False, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_the_server_freezes_what_it_loaded_and_collects_fully_less_often():
    """What is loaded before serving is never scanned again by the cycle collector, and
    full collections are rarer (control/server.py: a full collection of a 10,000-node
    registry stalled every heartbeat for 100-300 ms)."""
    import gc

    from tierlink.control.server import _tune_gc

    threshold = gc.get_threshold()
    try:
        _tune_gc()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[2] == 100
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
