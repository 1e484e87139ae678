"""A device's battery and heat on a live fleet: a device whose state file says its battery
is low sends upstream the requests it would answer itself — its answers say why — and
still answers those no upstream may take (privacy ``local``); back on power it answers them
again. The control plane's fleet view shows the state it reports."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import Answer, route

pytestmark = pytest.mark.integration

FLEET = """
name: itest-device-state
seed: 5
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.9}
  device_state: {low_battery: 0.2, hot: serious}
nodes:
  - {id: edge-1, tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,  tier: device, models: [fmnist-small], device_state_file: STATE}
links:
  - {from: dev-1, to: edge-1, delay_ms: 2}
"""


def ask(fleet: RunningFleet, http: httpx.Client, data: Labelled, sample: int,
        privacy: str = "site") -> Answer:
    answer = route(http, fleet.node_urls["dev-1"], data.input[sample: sample + 1],
                   privacy=privacy)
    assert answer.status == 200, answer.error
    return answer


def reported(fleet: RunningFleet, http: httpx.Client) -> object:
    """dev-1's device state as the control plane's fleet view shows it."""
    view = http.get(f"{fleet.control_url}/v1/fleet",
                    headers={"authorization": f"Bearer admin:{fleet.admin_token}"}).json()
    return next(n["device_state"] for n in view["nodes"] if n["node_id"] == "dev-1")


def until(check: Callable[[], bool], what: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        time.sleep(0.2)


def test_a_low_battery_sends_work_upstream_and_says_so(
        start_fleet: Callable[[str], RunningFleet], http: httpx.Client, fmnist_test: Labelled,
        tmp_path: Path) -> None:
    state = tmp_path / "dev-1-state.json"
    state.write_text(json.dumps({"battery": 0.9, "charging": False}))
    fleet = start_fleet(FLEET.replace("STATE", str(state)))
    # Inputs the device answers itself on a full battery (confident enough: no escalation)
    mine = [s for s in range(200) if ask(fleet, http, fmnist_test, s).served_by == "dev-1"]
    assert len(mine) >= 5

    state.write_text(json.dumps({"battery": 0.12, "charging": False, "thermal": "nominal"}))
    until(lambda: ask(fleet, http, fmnist_test, mine[0]).served_by == "edge-1",
          "the device spares its battery")
    answers = [ask(fleet, http, fmnist_test, s) for s in mine]
    assert {a.served_by for a in answers} == {"edge-1"}
    assert all(a.parameters["tierlink.reason"].endswith("(low battery: local compute spared)")
               for a in answers), answers[0].parameters["tierlink.reason"]
    # No upstream may hold a `local` input: the device answers it, low battery or not.
    local = ask(fleet, http, fmnist_test, mine[0], privacy="local")
    assert local.served_by == "dev-1" and "spared" not in local.parameters["tierlink.reason"]
    until(lambda: reported(fleet, http) == {"battery": 0.12, "charging": False,
                                            "thermal": "nominal"},
          "the fleet view shows the battery")

    state.write_text(json.dumps({"battery": 0.12, "charging": True}))  # plugged in
    until(lambda: ask(fleet, http, fmnist_test, mine[0]).served_by == "dev-1",
          "the device answers again once charging")
