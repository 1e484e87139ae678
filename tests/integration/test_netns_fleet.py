"""A fleet on kernel networking (`tierlink up --netns`): every node in a network namespace
of its own with its own address, link bandwidth in htb classes and loss in iptables; a
request crosses the namespaces; a clean stop and a kill -9 of `tierlink up` itself both
leave no namespace, interface, process or cgroup behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import launch
from tierlink.models.data import Labelled

from .integration_support import Models, fleet_config, infer, wait_for

pytestmark = pytest.mark.integration

FLEET = """
name: itest-netns
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.99999, fmnist-medium: 0.9}  # the edge answers what it is sure of
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,   tier: device, models: [fmnist-small], cpu_quota: 0.5}
links:
  - {from: dev-1, to: edge-1, delay_ms: 2, bandwidth_mbit: 20, loss: 0.001}
  - {from: edge-1, to: cloud-1, delay_ms: 5, bandwidth_mbit: 50}
"""
ANY = {"tierlink.privacy": "any", "tierlink.deadline_ms": 5000.0}


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def leftovers(tag: str) -> list[str]:
    """Namespaces and interfaces of the fabric ``tag`` still on this machine."""
    names = ip("netns", "list") + ip("-br", "link")
    return [line.split()[0] for line in names.splitlines() if tag in line]


def sent_bytes(netns: str) -> int:
    """Bytes the htb classes on a namespace's eth0 sent (the links' shaped traffic)."""
    out = subprocess.run(["ip", "netns", "exec", netns, "tc", "-s", "class", "show", "dev",
                          "eth0"], capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[1]) for line in out.splitlines()
               if line.strip().startswith("Sent"))


def test_requests_cross_namespaces_on_shaped_links_and_a_stop_removes_them(
        zoo_models: Models, tmp_path: Path, fmnist_test: Labelled, cloud_samples: np.ndarray,
        http: httpx.Client) -> None:
    fleet = launch(fleet_config(FLEET, "itest-netns"), zoo_models, tmp_path / "run",
                   netns=True)
    try:
        plan = fleet.fabric.plan
        hosts = {h.node_id: h for h in plan.hosts}
        assert {u.split("//")[1].split(":")[0] for u in fleet.node_urls.values()} == \
            {h.address for h in plan.hosts}  # each node its own address
        assert fleet.control_url.startswith(f"http://{plan.gateway}:")
        before = sent_bytes(hosts["dev-1"].netns)
        x = fmnist_test.input[cloud_samples[0]: cloud_samples[0] + 1]
        answer = infer(http, fleet.node_urls["dev-1"], "fmnist", x, ANY)
        assert answer.status == 200, answer.error
        assert answer.path == ["dev-1", "edge-1", "cloud-1"]
        assert sent_bytes(hosts["dev-1"].netns) > before + x.nbytes  # through the htb class
        rules = subprocess.run(["ip", "netns", "exec", hosts["dev-1"].netns, "iptables",
                                "-S", "OUTPUT"], capture_output=True, text=True,
                               check=True).stdout
        assert "--probability 0.001" in rules and "-j DROP" in rules
        pids = [p.pid for p in fleet.procs.values()]
    finally:
        fleet.stop()
    assert leftovers(plan.tag) == []
    assert not any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in pids)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_killed_tierlink_up_leaves_nothing_behind(zoo_models: Models, tmp_path: Path,
                                                    ) -> None:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(FLEET)
    run_dir = tmp_path / "run"
    up = subprocess.Popen([sys.executable, "-m", "tierlink.cli.main", "up", str(fleet_file),
                           "--netns", "--json", "--run-dir", str(run_dir)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          start_new_session=True)
    try:
        info = json.loads(_read_json(up))
        state = json.loads((run_dir / "netns.json").read_text())
        tag, pids = state["plan"]["tag"], state["pids"]
        assert leftovers(tag) and len(pids) >= 5  # control, links, three nodes
        os.kill(up.pid, signal.SIGKILL)
        up.wait(10)
        wait_for(lambda: not leftovers(tag) or None, 30, "the reaper removing the fabric")
        wait_for(lambda: all(_state(p) in ("gone", "Z") for p in pids) or None, 30,
                 "the fleet's processes ending")
        wait_for(lambda: not (run_dir / "netns.json").exists() or None, 10,
                 "the reaper's state file removed once it is done")
        assert "removed fabric" in (run_dir / "logs" / "reaper.log").read_text()
        assert set(info["nodes"]) == {"cloud-1", "edge-1", "dev-1"}
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)


def _read_json(proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> str:
    """`tierlink up --json` prints its endpoints once the fleet is ready."""
    assert proc.stdout is not None
    deadline, text = time.monotonic() + timeout_s, b""
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        chunk = proc.stdout.read() or b""
        text += chunk
        if text.rstrip().endswith(b"}"):
            return text.decode()
        if proc.poll() is not None:
            raise AssertionError(f"tierlink up exited with {proc.returncode}")
        time.sleep(0.2)
    raise AssertionError("tierlink up printed no endpoints in time")


