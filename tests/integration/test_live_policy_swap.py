"""The fleet's policy switched while it serves: under 60 requests/s from three devices,
``PUT /v1/routing`` (what ``tierlink policy apply`` sends) moves every node to the new
revision within 2 s, no request fails, and every answer names the revision its entry node
placed it under — the old one before the switch, the new one once its device runs it. And
end to end: shadow mode, ``tierlink policy evaluate``, ``tierlink policy promote``, the
running fleet on the promoted revision."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled
from tierlink.settings.routing import parse_routing
from tierlink.transport.oip import HEADER_LENGTH, decode_infer_response, encode_infer_request

pytestmark = pytest.mark.integration

FLEET = """
name: itest-live-policy
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
routing: {policy: tierlink}
nodes:
  - {id: cloud-1, tier: cloud, models: [fmnist-large]}
  - {id: edge-1, tier: edge, models: [fmnist-medium]}
  - {id: dev-1, tier: device, models: [fmnist-small]}
  - {id: dev-2, tier: device, models: [fmnist-small]}
  - {id: dev-3, tier: device, models: [fmnist-small]}
links:
  - {from: [dev-1, dev-2, dev-3], to: edge-1, delay_ms: 2}
  - {from: edge-1, to: cloud-1, delay_ms: 5}
"""
DEVICES = ("dev-1", "dev-2", "dev-3")
RATE_PER_S, SECONDS, SWITCH_AT_S = 60.0, 6.0, 2.0


async def _send(client: httpx.AsyncClient, url: str, x: np.ndarray) -> tuple[int, int]:
    """(HTTP status, the answer's routing revision; -1 without one)."""
    body, headers = encode_infer_request(
        {"input": x}, {"tierlink.privacy": "any", "tierlink.deadline_ms": 2000}, None,
        binary_inputs=True, binary_outputs=True)
    resp = await client.post(f"{url}/v2/models/fmnist/infer", content=body, headers=headers)
    if not resp.is_success:
        return resp.status_code, -1
    header = resp.headers.get(HEADER_LENGTH)
    params = decode_infer_response(resp.content, None if header is None else int(header))
    return resp.status_code, int((params.parameters or {})["tierlink.routing_revision"])


async def _revisions(client: httpx.AsyncClient, fleet: RunningFleet) -> dict[str, int]:
    out = {}
    for node, url in fleet.node_urls.items():
        status = (await client.get(f"{url}/tierlink/v1/status")).json()
        out[node] = int(status["routing_revision"])
    return out


async def _run(fleet: RunningFleet, data: Labelled) -> dict[str, Any]:
    sent: list[tuple[float, str, asyncio.Task[tuple[int, int]]]] = []
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=10.0, trust_env=False, limits=limits) as client:
        before = await _revisions(client, fleet)
        start = time.monotonic()
        switched_at = everyone_at = None
        new_revision = -1
        for i in range(int(RATE_PER_S * SECONDS)):
            due = start + i / RATE_PER_S
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            device = DEVICES[i % len(DEVICES)]
            x = data.input[i % len(data.labels): i % len(data.labels) + 1]
            sent.append((time.monotonic(), device, asyncio.create_task(
                _send(client, fleet.node_urls[device], x))))
            if switched_at is None and time.monotonic() - start >= SWITCH_AT_S:
                section = parse_routing({"policy": "bandit"}).to_dict()
                made = await client.put(f"{fleet.control_url}/v1/routing",
                                        json={"routing": section, "note": "live test"},
                                        headers=fleet.admin_headers)
                assert made.status_code == 201, made.text
                new_revision, switched_at = int(made.json()["revision"]), time.monotonic()
            if switched_at is not None and everyone_at is None and i % 6 == 0:
                now = await _revisions(client, fleet)
                if set(now.values()) == {new_revision}:
                    everyone_at = time.monotonic()
        answers = [(t, device, await task) for t, device, task in sent]
        while everyone_at is None and switched_at is not None \
                and time.monotonic() - switched_at < 10:
            if set((await _revisions(client, fleet)).values()) == {new_revision}:
                everyone_at = time.monotonic()
            await asyncio.sleep(0.1)
    return {"before": before, "new": new_revision, "switched_at": switched_at,
            "everyone_at": everyone_at, "answers": answers}


def test_the_policy_switched_under_load_loses_nothing(start_fleet: Any,
                                                      fmnist_test: Labelled) -> None:
    fleet: RunningFleet = start_fleet(FLEET)
    run = asyncio.run(_run(fleet, fmnist_test))
    old, new = set(run["before"].values()), run["new"]
    assert len(old) == 1 and new == next(iter(old)) + 1, run["before"]
    answers = run["answers"]
    assert len(answers) >= RATE_PER_S * SECONDS
    failed = [a for a in answers if a[2][0] != 200]
    assert failed == [], failed[:5]
    assert run["everyone_at"] is not None, "not every node took the new revision"
    assert run["everyone_at"] - run["switched_at"] <= 2.0
    (old_revision,) = old
    for sent_at, device, (_status, revision) in answers:
        if sent_at < run["switched_at"]:
            assert revision == old_revision, (device, sent_at)
        elif sent_at > run["everyone_at"]:
            assert revision == new, (device, sent_at)
        else:
            assert revision in (old_revision, new)
    assert sum(a[2][1] == new for a in answers) > RATE_PER_S  # a real share after the swap


SHADOW_FLEET = """
name: itest-shadow-promote
seed: 5
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  policy: tierlink
  weights: {accuracy: 0.0, latency: 1.0, cost: 2.0}   # blind to accuracy: keeps all here
  shadow: {policy: tierlink, weights: {accuracy: 1.0, latency: 1.0, cost: 2.0}, explore: 0.3}
nodes:
  - {id: edge-1, tier: edge, models: [fmnist-medium]}
  - {id: dev-1, tier: device, models: [fmnist-small]}
  - {id: dev-2, tier: device, models: [fmnist-small]}
links:
  - {from: [dev-1, dev-2], to: edge-1, delay_ms: 2}
"""


def test_shadow_then_evaluate_then_promote_switches_the_running_fleet(
        start_fleet: Any, fmnist_test: Labelled, tmp_path: Any) -> None:
    """A candidate decides beside an acting policy that ignores accuracy; its log says it is
    better; ``tierlink policy promote`` rewrites the file and the running fleet takes it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    fleet: RunningFleet = start_fleet(SHADOW_FLEET)
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(SHADOW_FLEET)
    with httpx.Client(timeout=10.0, trust_env=False) as http:
        for i in range(1200):
            device = ("dev-1", "dev-2")[i % 2]
            body, headers = encode_infer_request(
                {"input": fmnist_test.input[i: i + 1]},
                {"tierlink.privacy": "any", "tierlink.deadline_ms": 1000,
                 "tierlink.label": int(fmnist_test.labels[i])}, None,
                binary_inputs=True, binary_outputs=True)
            resp = http.post(f"{fleet.node_urls[device]}/v2/models/fmnist/infer",
                             content=body, headers=headers)
            assert resp.status_code == 200, resp.text
        before = http.get(f"{fleet.control_url}/v1/routing",
                          headers=fleet.admin_headers).json()["current"]["revision"]
        logs = [str(fleet.run_dir / "state" / d / "shadow.jsonl") for d in ("dev-1", "dev-2")]
        tierlink = [str(Path(sys.executable).parent / "tierlink"), "policy"]
        evaluated = subprocess.run([*tierlink, "evaluate", *logs, "--json"], capture_output=True,
                                   text=True, timeout=120, check=False)
        assert evaluated.returncode == 0, evaluated.stderr
        report = json.loads(evaluated.stdout)
        assert report["decisions"] >= 1000
        assert report["candidate"]["ci_low"] > report["acting"]["estimate"], report
        promoted = subprocess.run(
            [*tierlink, "promote", str(fleet_file), *logs, "--control", fleet.control_url,
             "--admin-token", fleet.admin_token], capture_output=True, text=True, timeout=120,
            check=False)
        assert promoted.returncode == 0, promoted.stdout + promoted.stderr
        current = http.get(f"{fleet.control_url}/v1/routing",
                           headers=fleet.admin_headers).json()["current"]
        assert current["revision"] == before + 1 and current["note"] == "promote"
        assert current["routing"]["weights"]["accuracy"] == 1.0
        assert "shadow" not in current["routing"]
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            revisions = {n: http.get(f"{u}/tierlink/v1/status").json()["routing_revision"]
                         for n, u in fleet.node_urls.items()}
            if set(revisions.values()) == {current["revision"]}:
                break
            time.sleep(0.2)
        assert set(revisions.values()) == {current["revision"]}, revisions
