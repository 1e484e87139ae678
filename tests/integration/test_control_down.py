"""The control plane is not on the request path: with it stopped for longer than its TTL,
nodes keep routing across tiers from their cached view of the fleet."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import assert_consistent, node_status, route

pytestmark = pytest.mark.integration

FLEET = """
name: itest-control-down
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.9, fmnist-medium: 0.9}
  breaker: {failure_threshold: 3, cooldown_s: 1}
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,   tier: device, models: [fmnist-small]}
links:
  - {from: dev-1,  to: edge-1,  delay_ms: 2}
  - {from: edge-1, to: cloud-1, delay_ms: 10}
"""
# Beyond the TTL: a registry that was up would have expired every silent node by then.
OUTAGE_S = 3.0 + 2.0


def tiers_reached(fleet: RunningFleet, http: httpx.Client, data: Labelled, samples: np.ndarray,
                  privacy: str) -> set[str]:
    """Send each sample to dev-1; every answer must be a consistent 200."""
    tiers = set()
    for sample in samples:
        answer = route(http, fleet.node_urls["dev-1"], data.input[sample: sample + 1],
                       privacy=privacy)
        assert_consistent(fleet, "dev-1", answer)
        tiers.add(answer.parameters["tierlink.tier"])
    return tiers


def wait_for_view(http: httpx.Client, fleet: RunningFleet, nodes: set[str],
                  timeout_s: float = 10.0) -> None:
    """Every node's view lists ``nodes`` (the launcher waits only for each node's upstreams)."""
    deadline = time.monotonic() + timeout_s
    for node_id in nodes:
        while not nodes <= set(node_status(http, fleet.node_urls[node_id])["view_nodes"]):
            assert time.monotonic() < deadline, f"{node_id} never saw all of {sorted(nodes)}"
            time.sleep(0.1)


def test_nodes_route_from_their_cached_view_while_control_is_down(
        start_fleet: Callable[[str], RunningFleet], http: httpx.Client, fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    fleet = start_fleet(FLEET)
    wait_for_view(http, fleet, {"dev-1", "edge-1", "cloud-1"})
    assert "edge" in tiers_reached(fleet, http, fmnist_test, hard_samples[:5], "site")

    control = fleet.procs["control"]
    control.send_signal(signal.SIGTERM)  # by pid: this fleet's own control plane
    control.wait(10)
    with pytest.raises(httpx.TransportError):
        http.get(f"{fleet.control_url}/healthz")

    # Keep routing through the whole outage, and past the TTL.
    stopped_at, reached, rounds = time.monotonic(), set(), 0
    while time.monotonic() - stopped_at < OUTAGE_S:
        batch = hard_samples[(5 * rounds + np.arange(5)) % 60]
        reached |= tiers_reached(fleet, http, fmnist_test, batch, "site")
        rounds += 1
    assert "edge" in reached, f"site requests stopped reaching the edge: {reached}"

    # After the TTL: the cached view still holds every node, and requests still climb.
    status = node_status(http, fleet.node_urls["dev-1"])
    assert {"edge-1", "cloud-1"} <= set(status["view_nodes"]), status
    assert "edge" in tiers_reached(fleet, http, fmnist_test, hard_samples[60:70], "site")
    assert "cloud" in tiers_reached(fleet, http, fmnist_test, hard_samples[70:100], "any")
    for node_id in ("dev-1", "edge-1"):  # nobody was handed a view emptied by the outage
        assert {"edge-1", "cloud-1"} <= set(node_status(http, fleet.node_urls[node_id])["view_nodes"])
