"""Mirroring on a running fleet (``routing.mirror``): a share of the device's answers is asked
again of the most capable model each request's privacy allows — in the background, never
further than that privacy — and agreement per model version reaches the control plane in
heartbeats; the mirrors are on the bill under path ``mirror``."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import infer, metric_sum, route, wait_for

pytestmark = pytest.mark.integration

# The device answers everything itself: every answer is its model's to mirror.
FLEET = """
name: itest-mirror
seed: 4
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  policy: device_only
  mirror: {share: 0.05, max_in_flight: 8}
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,   tier: device, models: [fmnist-small]}
links:
  - {from: dev-1, to: edge-1, delay_ms: 2}
  - {from: edge-1, to: cloud-1, delay_ms: 5}
"""

RECEIVED = "tierlink_inputs_received_total"


def received(http: httpx.Client, fleet: RunningFleet, node: str, privacy: str) -> float:
    return metric_sum(http, fleet.node_urls[node], RECEIVED, privacy=privacy)


def test_answers_are_mirrored_to_the_most_capable_model_their_privacy_allows(
        start_fleet: Callable[[str], RunningFleet], http: httpx.Client,
        fmnist_test: Labelled) -> None:
    fleet = start_fleet(FLEET)
    dev = fleet.node_urls["dev-1"]
    sent = {"any": 240, "site": 120, "local": 120}
    for privacy, n in sent.items():
        for i in range(n):
            answer = route(http, dev, fmnist_test.input[i: i + 1], privacy=privacy)
            assert answer.status == 200, answer.error
            assert answer.served_by == "dev-1"  # the answer never waits for a mirror

    def compared() -> float | None:
        n = metric_sum(http, dev, "tierlink_mirrors_total", outcome="compared")
        return n if n >= 0.04 * sum(sent.values()) else None

    wait_for(compared, 30, "dev-1's mirrors compared")
    assert metric_sum(http, dev, "tierlink_mirrors_total", outcome="failed") == 0
    mirrored = metric_sum(http, dev, "tierlink_mirrored_samples_total", model="fmnist-small")
    agreed = metric_sum(http, dev, "tierlink_mirror_agreed_samples_total",
                        model="fmnist-small")
    assert 0.04 * 480 <= mirrored <= 0.06 * 480 and 0 < agreed <= mirrored
    # never further than privacy allows: the cloud saw only `any` inputs, the edge no
    # `local` ones (a `local` request's most capable model is the device's own)
    assert received(http, fleet, "cloud-1", "any") > 0
    assert received(http, fleet, "cloud-1", "site") == 0
    assert received(http, fleet, "cloud-1", "local") == 0
    assert received(http, fleet, "edge-1", "site") > 0
    assert received(http, fleet, "edge-1", "local") == 0
    assert metric_sum(http, dev, "tierlink_cost_usd_total", path="mirror") > 0

    def reported() -> dict | None:
        nodes = http.get(f"{fleet.control_url}/v1/nodes", headers=fleet.admin_headers).json()
        stats = [m.get("stats") or {} for n in nodes["nodes"] if n["node_id"] == "dev-1"
                 for m in n["models"] if m["name"] == "fmnist-small"]
        return stats[0] if stats and stats[0].get("mirrored") == mirrored else None

    stats = wait_for(reported, 15, "dev-1's heartbeat with its mirrored samples")
    assert stats["agreed"] == agreed

    # a client cannot ask for a mirror (it is the fleet's to sample)
    refused = infer(http, dev, "fmnist", fmnist_test.input[:1], {"tierlink.mirror": True})
    assert refused.status == 400 and "tierlink.mirror" in str(refused.error)
