"""A control plane of two replicas over a three-member etcd cluster, as `tierlink up`
starts it: both serve one view and one store of hard examples; killing a replica (kill -9), then an etcd member, costs no
request and no registration; a node that dies leaves the view when its lease runs out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import assert_consistent, route

pytestmark = pytest.mark.integration

TTL_S = 3.0
FLEET = f"""
name: itest-control-replicas
seed: 3
zoo: {{profile: test}}
control: {{store: etcd, replicas: 2, etcd_members: 3, ttl_s: {TTL_S}}}
routing:
  policy: tierlink
  thresholds: {{fmnist-small: 0.9, fmnist-medium: 0.9}}
nodes:
  - {{id: cloud-1, tier: cloud,  models: [fmnist-large]}}
  - {{id: edge-1,  tier: edge,   models: [fmnist-medium]}}
  - {{id: dev-1,   tier: device, models: [fmnist-small]}}
links:
  - {{from: dev-1,  to: edge-1,  delay_ms: 2}}
  - {{from: edge-1, to: cloud-1, delay_ms: 10}}
"""


def listed(fleet: RunningFleet, http: httpx.Client, replica: int) -> dict[str, Any]:
    """The nodes one replica lists: {node id: record}."""
    r = http.get(f"{fleet.control_urls[replica]}/v1/nodes", headers=fleet.admin_headers)
    r.raise_for_status()
    return {n["node_id"]: n for n in r.json()["nodes"]}


def serve_for(fleet: RunningFleet, http: httpx.Client, data: Labelled, samples: np.ndarray,
              seconds: float) -> set[str]:
    """Route requests from dev-1 for ``seconds``; every one must be a consistent 200."""
    started, tiers, i = time.monotonic(), set(), 0
    while time.monotonic() - started < seconds:
        sample = int(samples[i % len(samples)])
        answer = route(http, fleet.node_urls["dev-1"], data.input[sample: sample + 1],
                       privacy="any")
        assert_consistent(fleet, "dev-1", answer)
        tiers.add(answer.parameters["tierlink.tier"])
        i += 1
    return tiers


def hard_example_ids(fleet: RunningFleet, http: httpx.Client, replica: int) -> set[int]:
    r = http.get(f"{fleet.control_urls[replica]}/v1/hard-examples",
                 params={"limit": 1000}, headers=fleet.admin_headers)
    r.raise_for_status()
    return {int(e["id"]) for e in r.json()["examples"]}


def hard_examples_delivered(fleet: RunningFleet, http: httpx.Client, data: Labelled,
                            samples: np.ndarray, replica: int) -> set[int]:
    """Route hard inputs until ``replica`` lists hard examples (nodes deliver in batches)."""
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        serve_for(fleet, http, data, samples, 0.5)
        if ids := hard_example_ids(fleet, http, replica):
            return ids
    raise AssertionError(f"replica {replica} never listed a hard example")


def test_replicas_share_one_view_and_survive_a_replica_and_an_etcd_member(
        start_fleet: Callable[[str], RunningFleet], http: httpx.Client, fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    fleet = start_fleet(FLEET)
    assert len(fleet.control_urls) == 2 and fleet.etcd is not None
    everyone = {"cloud-1", "edge-1", "dev-1"}
    assert set(listed(fleet, http, 0)) == everyone
    assert set(listed(fleet, http, 1)) == everyone
    generations = {k: v["generation"] for k, v in listed(fleet, http, 1).items()}
    # Hard examples the nodes deliver land in etcd: what replica 0 took, replica 1 lists.
    delivered = hard_examples_delivered(fleet, http, fmnist_test, hard_samples, replica=0)
    assert delivered <= hard_example_ids(fleet, http, 1)

    fleet.kill_control(0)  # kill -9 the replica cloud-1 and dev-1 talk to (their ids' hash)
    tiers = serve_for(fleet, http, fmnist_test, hard_samples, TTL_S + 2.0)
    assert "cloud" in tiers or "edge" in tiers, tiers
    after = listed(fleet, http, 1)
    assert set(after) == everyone, "a node expired while its heartbeats moved replica"
    assert {k: v["generation"] for k, v in after.items()} == generations
    assert all(v["age_s"] < TTL_S for v in after.values()), after

    fleet.etcd.kill(0)  # and one etcd member: two of three keep a quorum
    serve_for(fleet, http, fmnist_test, hard_samples, TTL_S + 2.0)
    after = listed(fleet, http, 1)
    assert set(after) == everyone
    assert {k: v["generation"] for k, v in after.items()} == generations

    fleet.kill("edge-1")  # a dead node leaves when its lease runs out (ttl + ttl/3)
    deadline = time.monotonic() + TTL_S * 4 / 3 + 3.0
    while "edge-1" in listed(fleet, http, 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(listed(fleet, http, 1)) == {"cloud-1", "dev-1"}
