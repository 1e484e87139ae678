"""Live topology on real processes: an edge that joins a running fleet takes traffic within
seconds without anyone restarting; a drained edge gets no new work and loses none it held."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from tierlink.core.types import Tier
from tierlink.fleet.config import NodeConfig
from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import node_status, route

pytestmark = pytest.mark.integration

FLEET = """
name: itest-live-topology
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.9, fmnist-medium: 0.9}
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,   tier: device, models: [fmnist-small]}
links:
  - {from: dev-1,  to: edge-1,  delay_ms: 5}
  - {from: edge-1, to: cloud-1, delay_ms: 10}
"""
JOIN_WITHIN_S = 10.0


def served_by(fleet: RunningFleet, http: httpx.Client, data: Labelled, sample: int) -> str:
    answer = route(http, fleet.node_urls["dev-1"], data.input[sample: sample + 1],
                   privacy="site")
    assert answer.status == 200, answer.error
    return answer.served_by


def test_a_new_edge_takes_traffic_and_a_drained_one_gets_none(
        start_fleet: Callable[[str], RunningFleet], http: httpx.Client, fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    fleet = start_fleet(FLEET)
    assert set(node_status(http, fleet.node_urls["dev-1"])["links"]) == {"edge-1"}

    # edge-2 joins in dev-1's site (the label the fleet read from its links).
    started = time.monotonic()
    url = fleet.add_node(NodeConfig("edge-2", Tier.EDGE, ("fmnist-medium",),
                                    labels={"site": "site-edge-1"}))
    seen: set[str] = set()
    i = 0
    while "edge-2" not in seen and time.monotonic() - started < JOIN_WITHIN_S + 30:
        seen.add(served_by(fleet, http, fmnist_test, int(hard_samples[i % len(hard_samples)])))
        i += 1
    took = time.monotonic() - started
    assert "edge-2" in seen, f"edge-2 never served: {seen}"
    assert set(node_status(http, fleet.node_urls["dev-1"])["links"]) == {"edge-1", "edge-2"}
    print(f"edge-2 served {took:.1f} s after it was started (its start included)")

    # Requests in flight while edge-2 is drained all get their answer.
    answers: list[int] = []

    def send(sample: int) -> None:
        answer = route(http, fleet.node_urls["dev-1"], fmnist_test.input[sample: sample + 1],
                       privacy="site")
        answers.append(answer.status)

    threads = [threading.Thread(target=send, args=(int(s),)) for s in hard_samples[:20]]
    for t in threads:
        t.start()
    drained = http.post(f"{fleet.control_url}/v1/nodes/edge-2/drain",
                        headers=fleet.admin_headers)
    assert drained.status_code == 200 and drained.json()["draining"] is True
    for t in threads:
        t.join(30)
    assert answers == [200] * 20

    deadline = time.monotonic() + 5.0  # the registry view reaches dev-1 within a refresh
    while "edge-2" in node_status(http, fleet.node_urls["dev-1"])["links"]:
        assert time.monotonic() < deadline, "dev-1 still sends to the drained edge-2"
        time.sleep(0.1)
    after = {served_by(fleet, http, fmnist_test, int(s)) for s in hard_samples[:40]}
    assert "edge-2" not in after and "edge-1" in after, after
    status = node_status(http, url)
    assert status["draining"] is True and status["inflight"] == 0
