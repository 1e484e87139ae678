"""The fleet's policy switched while it serves: under 60 requests/s from three devices,
``PUT /v1/routing`` (what ``tierlink policy apply`` sends) moves every node to the new
revision within 2 s, no request fails, and every answer names the revision its entry node
placed it under — the old one before the switch, the new one once its device runs it."""

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
