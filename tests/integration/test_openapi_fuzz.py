"""Schemathesis over every OpenAPI document of a running fleet — a device and an edge node,
the control plane (as an operator, so its operator routes are fuzzed too) and the link
emulator: whatever it sends, no answer is a 5xx."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierlink.fleet.launcher import RunningFleet

from .integration_support import Models, running_fleet

pytestmark = pytest.mark.integration

FLEET = """
name: itest-fuzz
seed: 9
zoo: {profile: test}
control: {ttl_s: 3}
routing: {policy: tierlink, thresholds: {fmnist-small: 0.9}}
nodes:
  - {id: edge-1, tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,  tier: device, models: [fmnist-small]}
links:
  - {from: dev-1, to: edge-1, delay_ms: 2}
"""
# The fleet view's event stream never ends by design; everything else is fuzzed.
EXCLUDE = "^/v1/fleet/events$"


def schemathesis(url: str, *headers: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    args = [st, "run", f"{url}/openapi.json", "--checks", "not_a_server_error",
            "--max-examples", "25", "--request-timeout", "15",
            "--generation-deterministic", "--exclude-path-regex", EXCLUDE]
    for header in headers:
        args += ["-H", header]
    return subprocess.run(args, capture_output=True, text=True, timeout=600, check=False,
                          cwd=cwd, env=dict(os.environ, NO_COLOR="1", COLUMNS="160"))


@pytest.fixture(scope="module")
def fleet(zoo_models: Models, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[RunningFleet]:
    """One fleet for every target: a fuzzed request must leave it serving, so the next
    target's run starts from whatever the last one left."""
    with running_fleet(FLEET, tmp_path_factory.mktemp("fuzz"), zoo_models) as running:
        yield running


@pytest.mark.parametrize("target", ["dev-1", "edge-1", "control", "links"])
def test_no_fuzzed_request_gets_a_5xx(fleet: RunningFleet, target: str,
                                     tmp_path: Path) -> None:
    headers: tuple[str, ...] = ()
    if target == "control":
        url, headers = fleet.control_url, (f"Authorization: Bearer admin:{fleet.admin_token}",)
    elif target == "links":
        url = fleet.links_url
    else:
        url = fleet.node_urls[target]
    done = schemathesis(url, *headers, cwd=tmp_path)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "generated" in done.stdout, tail
    # The fleet still serves after it (a fuzzed request never took a process down).
    for name, proc in fleet.procs.items():
        assert proc.poll() is None, f"{name} exited with {proc.returncode}"
