"""Routing across real node processes: privacy holds, deadlines with room let answers climb
the tiers, and every answer's routing parameters describe the route it actually took."""

from __future__ import annotations

import collections

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import Answer, assert_consistent, metric_samples, metric_sum, route

pytestmark = pytest.mark.integration

DEVICES = ("dev-1", "dev-2")
INPUTS = "tierlink_inputs_received_total"


def send_all(fleet: RunningFleet, http: httpx.Client, data: Labelled, samples: np.ndarray,
             privacy: str, deadline_ms: float = 2000.0) -> list[tuple[str, Answer]]:
    """Send each sample, alternating the devices; every answer must be a consistent 200."""
    answers = []
    for i, sample in enumerate(samples):
        entry = DEVICES[i % len(DEVICES)]
        answer = route(http, fleet.node_urls[entry], data.input[sample: sample + 1],
                       privacy=privacy, deadline_ms=deadline_ms)
        assert_consistent(fleet, entry, answer)
        answers.append((entry, answer))
    return answers


def test_local_request_is_served_by_its_device(
        shared_fleet: RunningFleet, http: httpx.Client, fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    # Inputs the device model is unsure of: anything but `local` would escalate them.
    for entry, answer in send_all(shared_fleet, http, fmnist_test, hard_samples[:12], "local"):
        assert answer.path == [entry]
        assert answer.served_by == entry
        assert answer.parameters["tierlink.tier"] == "device"


def test_site_requests_never_reach_the_cloud(
        shared_fleet: RunningFleet, http: httpx.Client, fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    answers = send_all(shared_fleet, http, fmnist_test, hard_samples[:30], "site")

    assert all("cloud-1" not in a.path for _, a in answers)
    reached_edge = [a for _, a in answers if a.parameters["tierlink.tier"] == "edge"]
    assert reached_edge, "no site request escalated to an edge: the test proves nothing"
    # The nodes' own counters agree: the cloud never received a `site` input (not even one
    # it refused), and the edges received theirs as allowed.
    urls = shared_fleet.node_urls
    cloud_site = [(labels, v) for labels, v in metric_samples(http, urls["cloud-1"], INPUTS)
                  if labels["privacy"] == "site" and v > 0]
    assert cloud_site == []
    edge_allowed = sum(metric_sum(http, urls[e], INPUTS, privacy="site", verdict="allowed")
                       for e in ("edge-1", "edge-2"))
    edge_violations = sum(metric_sum(http, urls[e], INPUTS, privacy="site", verdict="violation")
                          for e in ("edge-1", "edge-2"))
    assert edge_allowed >= len(reached_edge)
    assert edge_violations == 0


def test_any_request_with_time_can_reach_the_cloud(
        shared_fleet: RunningFleet, http: httpx.Client, fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    cloud_url = shared_fleet.node_urls["cloud-1"]
    before = metric_sum(http, cloud_url, INPUTS, privacy="any", verdict="allowed")

    answers = send_all(shared_fleet, http, fmnist_test, hard_samples[30:60], "any")

    routes = collections.Counter(tuple(a.path) for _, a in answers)
    at_cloud = [(entry, a) for entry, a in answers if a.served_by == "cloud-1"]
    assert at_cloud, f"no `any` request reached the cloud; routes taken: {dict(routes)}"
    for entry, answer in at_cloud:
        # Devices link only to edges: the cloud is reached through an edge that escalated.
        assert answer.path[0] == entry and answer.path[1] in ("edge-1", "edge-2")
        assert answer.parameters["tierlink.tier"] == "cloud"
        assert answer.parameters["tierlink.model"] == "fmnist-large"
    after = metric_sum(http, cloud_url, INPUTS, privacy="any", verdict="allowed")
    assert after - before >= len(at_cloud)
