"""The operator's commands against a running fleet, as a user types them (each one a
``tierlink`` process): make a signing key, publish a version, list and show it, roll it out,
pause, resume, promote, and roll a second one back — while the edges install what they are
told and report it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tierlink.fleet.launcher import RunningFleet

from .integration_support import Models, tierlink, wait_for

pytestmark = pytest.mark.integration

FLEET = """
name: itest-fleet-cli
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
trusted_keys: [%s]
routing: {policy: tierlink}
nodes:
  - {id: edge-1, tier: edge,   models: [fmnist-medium]}
  - {id: edge-2, tier: edge,   models: [fmnist-medium],
     advertise_url: "http://edge-2.site-b.example:8000"}
  - {id: dev-1,  tier: device, models: [fmnist-small]}
links:
  - {from: dev-1, to: [edge-1, edge-2], delay_ms: 2}
"""
MODEL = "fmnist-medium"


def serving(http: httpx.Client, fleet: RunningFleet) -> dict[str, list[tuple[str, str]]]:
    """Per edge, (version, role) of every version of the model it reports."""
    nodes = http.get(f"{fleet.control_url}/v1/nodes", headers=fleet.admin_headers).json()
    return {n["node_id"]: sorted((m["version"], m.get("role", "active")) for m in n["models"]
                                 if m["name"] == MODEL)
            for n in nodes["nodes"] if n["tier"] == "edge"}


def test_publish_and_roll_out_with_the_cli(start_fleet: Callable[[str], RunningFleet],
                                           zoo_models: Models, http: httpx.Client,
                                           tmp_path: Path) -> None:
    key = tmp_path / "publisher.key"
    public = tierlink("model", "keygen", "--out", str(key)).strip().splitlines()[-1]
    fleet = start_fleet(FLEET % public)
    token, url = fleet.admin_token, fleet.control_url
    # a node registers the address it advertises, not the one it binds
    listed_nodes = http.get(f"{url}/v1/nodes", headers=fleet.admin_headers).json()["nodes"]
    address = {n["node_id"]: n["address"] for n in listed_nodes}
    assert address["edge-2"] == "http://edge-2.site-b.example:8000"
    assert address["edge-1"].startswith("http://127.0.0.1:")
    onnx, card = zoo_models[MODEL]
    for version in ("2", "3"):
        tierlink("model", "publish", MODEL, str(onnx), "--card", str(card), "--version", version,
                 "--notes", f"same weights, version {version}", "--key", str(key),
                 "--control", url, "--eval-limit", "200", token=token)
    listed = json.loads(tierlink("model", "list", "--control", url, "--json", token=token))
    assert {"2", "3"} <= {v["version"] for v in _versions(listed)}
    shown = json.loads(tierlink("model", "show", MODEL, "2", "--control", url, "--json",
                                token=token))
    assert shown["signed"]["manifest"]["validation"]["n"] == 200

    started = json.loads(tierlink("rollout", "start", MODEL, "2", "--tier", "edge", "--canary",
                                  "50%", "--soak", "10m", "--control", url, "--json",
                                  token=token))
    rid = str(started["id"])
    assert started["spec"]["previous"] == "1" and started["spec"]["stages"] == [0.5, 1.0]
    # 50% of two edges: one edge moves fully (installs into its slot, switches to "2").
    wait_for(lambda: sum(("2", "active") in v for v in serving(http, fleet).values()) == 1
             or None, 60, "one edge active on version 2")
    # The controller sees the switch on its next tick (about a second): soaking from then.
    wait_for(lambda: _phase(rid, url, token) == "soaking" or None, 30, "the stage soaking")
    # Resuming re-checks the stage's deployment first, then soaks again.
    for action, phases in (("pause", {"paused"}), ("resume", {"deploying", "soaking"}),
                           ("promote", None)):
        tierlink("rollout", action, rid, "--control", url, token=token)
        if phases:
            assert _phase(rid, url, token) in phases
    tierlink("rollout", "promote", rid, "--control", url, token=token)
    assert _phase(rid, url, token) == "promoted"
    wait_for(lambda: all(v == [("2", "active")] for v in serving(http, fleet).values()) or None,
             60, "both edges on version 2")
    status = tierlink("rollout", "status", "--control", url, token=token)
    assert "promoted" in status and MODEL in status

    second = json.loads(tierlink("rollout", "start", MODEL, "3", "--tier", "edge", "--canary",
                                 "10%", "--soak", "10m", "--control", url, "--json",
                                 token=token))
    tierlink("rollout", "rollback", str(second["id"]), "--reason", "changed my mind",
             "--control", url, token=token)
    record = json.loads(tierlink("rollout", "status", str(second["id"]), "--control", url,
                                 "--json", token=token))
    assert record["phase"] == "rolled_back"
    assert any("changed my mind" in t["reason"] for t in record["transitions"])
    wait_for(lambda: all(v == [("2", "active")] for v in serving(http, fleet).values()) or None,
             60, "both edges back on version 2 only")


def _versions(listed: Any) -> list[dict[str, Any]]:
    """``model list --json``'s versions, whichever shape it prints."""
    if isinstance(listed, dict):
        listed = listed.get("models", listed.get("versions", []))
    out = []
    for entry in listed:
        out += entry.get("versions", [entry]) if isinstance(entry, dict) else []
    return out


def _phase(rid: str, url: str, token: str) -> str:
    record = json.loads(tierlink("rollout", "status", rid, "--control", url, "--json",
                                 token=token))
    return str(record["phase"])
