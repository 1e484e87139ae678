"""LinkEmulator, its control API, spec files, and the emulator as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from netem_support import echo_server, run

from tierlink.errors import LinkEmulationError
from tierlink.netem.link import LinkSpec
from tierlink.netem.server import (
    LinkControlClient,
    LinkEmulator,
    create_control_app,
    load_specs,
    main,
    read_ready_file,
)


def _spec(name: str, port: int, **fields: Any) -> LinkSpec:
    return LinkSpec(name=name, target_host="127.0.0.1", target_port=port, **fields)


def test_control_api_lists_and_updates_links() -> None:
    async def scenario() -> None:
        async with echo_server() as port:
            specs = [_spec("device->edge", port, delay_ms=5), _spec("edge->cloud", port)]
            async with LinkEmulator(specs, seed=1) as emulator:
                transport = httpx.ASGITransport(app=create_control_app(emulator))
                async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                    await _exercise_api(http, emulator)

    run(scenario())


async def _exercise_api(http: httpx.AsyncClient, emulator: LinkEmulator) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok", "links": 2}
    links = (await http.get("/links")).json()["links"]
    assert [link["name"] for link in links] == ["device->edge", "edge->cloud"]
    assert links[0]["listen_port"] == emulator.link("device->edge").listen_port != 0
    assert links[0]["counters"]["connections"] == 0
    name = "device-%3Eedge"  # URL-quoted '->'
    answer = await http.put(f"/links/{name}", json={"delay_ms": 40, "up": False})
    assert answer.status_code == 200
    assert (answer.json()["delay_ms"], answer.json()["up"]) == (40, False)
    assert emulator.link("device->edge").spec.delay_ms == 40
    bad = await http.put(f"/links/{name}", json={"loss": 2})
    assert bad.status_code == 400 and bad.json()["code"] == "link_emulation_error"
    assert "loss" in bad.json()["error"]
    fixed = await http.put(f"/links/{name}", json={"target_port": 1})
    assert fixed.status_code == 400 and "target_port" in fixed.json()["error"]
    assert (await http.put("/links/nope", json={"delay_ms": 1})).status_code == 404
    assert (await http.put(f"/links/{name}", content=b"[1]")).status_code == 400
    broken = await http.put(f"/links/{name}", content=b"{",
                            headers={"content-type": "application/json"})
    assert broken.status_code == 400 and "not JSON" in broken.json()["error"]
    unknown = await http.put(f"/links/{name}", json={"delay": 3})
    assert unknown.status_code == 400 and "unknown field" in unknown.json()["error"]


def test_duplicate_link_names_are_refused() -> None:
    with pytest.raises(LinkEmulationError, match="duplicate"):
        LinkEmulator([_spec("a", 1), _spec("a", 2)])


def test_load_specs_reads_a_json_list(tmp_path: Path) -> None:
    path = tmp_path / "links.json"
    path.write_text(json.dumps([_spec("a", 80, delay_ms=5).to_dict(),
                                {"name": "b", "target_host": "127.0.0.1", "target_port": 81}]))
    assert [s.name for s in load_specs(path)] == ["a", "b"]
    path.write_text(json.dumps([{"name": "a", "target_host": "h", "target_port": 80,
                                 "loss": 3}]))
    with pytest.raises(LinkEmulationError, match="loss"):
        load_specs(path)
    path.write_text(json.dumps([{"name": "a", "target_port": 80}]))
    with pytest.raises(LinkEmulationError, match=r"links\[0\].*target_host"):
        load_specs(path)
    path.write_text('{"name": "a"}')
    with pytest.raises(LinkEmulationError, match="list"):
        load_specs(path)
    with pytest.raises(LinkEmulationError, match="cannot read"):
        load_specs(tmp_path / "missing.json")


def test_main_reports_a_bad_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "links.json"
    path.write_text("not json")
    assert main(["--spec", str(path)]) == 2
    assert "cannot read link specs" in capsys.readouterr().err


def test_client_maps_transport_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with LinkControlClient("http://127.0.0.1:9", transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(LinkEmulationError, match="cannot reach the link emulator"):
            client.list()
        assert not client.healthy()


# --- the real process ----------------------------------------------------------------------


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@contextmanager
def _threaded_echo() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def _emulator_process(spec_file: Path, ready_file: Path) -> Iterator[subprocess.Popen[bytes]]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierlink.netem.server", "--spec", str(spec_file),
         "--control-port", "0", "--ready-file", str(ready_file), "--seed", "1",
         "--log-level", "WARNING"], env=env, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


def _wait_ready(proc: subprocess.Popen[bytes], ready_file: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready_file.exists():
        if proc.poll() is not None:
            stderr = proc.stderr.read().decode() if proc.stderr else ""
            pytest.fail(f"emulator exited with {proc.returncode}: {stderr}")
        if time.monotonic() > deadline:
            pytest.fail("emulator did not write its ready file in time")
        time.sleep(0.02)


def _rtt(sock: socket.socket, n: int = 5) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        sock.sendall(b"ping")
        received = b""
        while len(received) < 4:
            chunk = sock.recv(4 - len(received))
            if not chunk:
                raise ConnectionResetError("closed")
            received += chunk
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def test_emulator_process_with_control_client(tmp_path: Path) -> None:
    spec_file, ready_file = tmp_path / "links.json", tmp_path / "ready.json"
    with _threaded_echo() as port:
        spec_file.write_text(json.dumps([_spec("device->edge", port, delay_ms=5).to_dict()]))
        with _emulator_process(spec_file, ready_file) as proc:
            _wait_ready(proc, ready_file)
            ready = read_ready_file(ready_file)
            assert ready.pid == proc.pid
            with LinkControlClient(ready.control_url) as client:
                _drive(client, ready.link_ports["device->edge"])
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
            assert not ready_file.exists()


def _drive(client: LinkControlClient, link_port: int) -> None:
    assert client.healthy()
    with socket.create_connection(("127.0.0.1", link_port), timeout=5) as sock:
        assert 0.008 <= _rtt(sock) <= 0.030
        client.update("device->edge", delay_ms=25)
        assert 0.045 <= _rtt(sock) <= 0.075
        (link,) = client.list()
        assert link["delay_ms"] == 25
        assert link["counters"]["bytes_forward"] == 40
        assert link["counters"]["active"] == 1
        client.update("device->edge", up=False)
        with pytest.raises(OSError):
            _rtt(sock, 1)
    with pytest.raises(LinkEmulationError, match="loss"):
        client.update("device->edge", loss=1)
    with pytest.raises(LinkEmulationError, match="no link named"):
        client.update("missing", delay_ms=1)
    assert client.get("device->edge")["counters"]["resets"] == 1
