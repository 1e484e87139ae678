"""Labelled plans across real processes: the device runs the head of the cloud's model, sends
the encoded features over an emulated link, the cloud runs the tail.

Judged against the cloud running the whole model: with the identity codec the answer is
bit-exact; with int8 it agrees. Features of a `local` request never leave unless the fleet
says they may; a malformed feature payload sent straight to the cloud is a clear 400 and the
cloud keeps serving.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled
from tierlink.split.partition import cut_points

from .integration_support import Models, infer, metric_sum

pytestmark = pytest.mark.integration

FLEET = """
name: itest-split
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
routing: {allow_policy_override: true, local_features_may_leave: %s}
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: dev-1,   tier: device, models: [fmnist-small], heads: [fmnist-large]}
links:
  - {from: dev-1, to: cloud-1, delay_ms: 2, bandwidth_mbit: 50}
"""


def split_params(cut: str, codec: str, privacy: str = "any") -> dict[str, Any]:
    return {"tierlink.privacy": privacy, "tierlink.deadline_ms": 5000.0,
            "tierlink.split": f"cloud-1/{cut}/{codec}"}


def wait_for_cloud(http: httpx.Client, url: str, x: np.ndarray) -> None:
    """The device must have seen cloud-1 in its view before a split can name it."""
    import time

    for _ in range(100):
        answer = infer(http, url, "fmnist", x, split_params(CUT, "fp32"))
        if answer.status == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"the device never split to cloud-1: {answer.error}")


CUT = ""


def test_split_answers_match_the_whole_model(start_fleet: Any, zoo_models: Models,
                                             fmnist_test: Labelled, http: httpx.Client) -> None:
    global CUT
    fleet: RunningFleet = start_fleet(FLEET % "false")
    cuts = [c.tensor for c in cut_points(zoo_models["fmnist-large"][0]) if c.index > 0]
    CUT = cuts[len(cuts) // 2]
    dev, cloud = fleet.node_urls["dev-1"], fleet.node_urls["cloud-1"]
    x = fmnist_test.input[:4]
    wait_for_cloud(http, dev, x[:1])
    whole = infer(http, cloud, "fmnist-large", x)
    assert whole.status == 200
    logits = next(iter(whole.outputs.values()))
    for cut in (cuts[0], CUT, cuts[-1]):
        exact = infer(http, dev, "fmnist", x, split_params(cut, "fp32"))
        assert exact.status == 200, exact.error
        assert json.loads(exact.parameters["tierlink.path"]) == ["dev-1", "cloud-1"]
        assert exact.parameters["tierlink.model"] == "fmnist-large"
        assert np.array_equal(exact.outputs["label"], logits.argmax(axis=1))
        packed = infer(http, dev, "fmnist", x, split_params(cut, "int8+zstd"))
        assert packed.status == 200, packed.error
        assert (packed.outputs["label"] == logits.argmax(axis=1)).mean() >= 0.75
    assert metric_sum(http, dev, "tierlink_split_requests_total") >= 6


def test_local_features_stay_unless_allowed(start_fleet: Any, fmnist_test: Labelled,
                                            http: httpx.Client) -> None:
    fleet: RunningFleet = start_fleet(FLEET % "false")
    dev = fleet.node_urls["dev-1"]
    x = fmnist_test.input[:1]
    global CUT
    CUT = CUT or "/11/MaxPool_output_0"
    wait_for_cloud(http, dev, x)
    refused = infer(http, dev, "fmnist", x, split_params(CUT, "int8", privacy="local"))
    assert refused.status == 403, refused
    assert "local_features_may_leave" in json.dumps(refused.error)
    received = metric_sum(http, fleet.node_urls["cloud-1"], "tierlink_inputs_received_total")
    assert received == 0  # nothing of it reached the cloud


def test_a_malformed_feature_payload_is_a_clear_error(start_fleet: Any, fmnist_test: Labelled,
                                                      http: httpx.Client) -> None:
    from tierlink.transport.oip import encode_infer_request

    fleet: RunningFleet = start_fleet(FLEET % "true")
    cloud = fleet.node_urls["cloud-1"]
    junk = np.frombuffer(b"TLF\x01garbage", dtype=np.uint8)
    body, headers = encode_infer_request({"features": junk}, {"tierlink.cut": "/11/MaxPool_output_0"},
                                         None, binary_inputs=True)
    resp = http.post(f"{cloud}/v2/models/fmnist-large/infer", content=body, headers=headers)
    assert resp.status_code == 400 and "codec" in resp.text.lower(), resp.text
    again = infer(http, cloud, "fmnist-large", fmnist_test.input[:1])
    assert again.status == 200  # still serving


def test_segments_are_opened_on_request_and_bad_ones_are_clear_errors(
        start_fleet: Any, zoo_models: Models, http: httpx.Client) -> None:
    """What a device's split warmer asks an upstream: open the tail at a cut now. Unknown
    model: 404; a tensor that is not a cut point: 400 with a hint; the node keeps serving.
    The device's status lists the heads it holds open (none were asked for here)."""
    fleet: RunningFleet = start_fleet(FLEET % "false")
    cloud = fleet.node_urls["cloud-1"]
    cut = next(c.tensor for c in cut_points(zoo_models["fmnist-large"][0]) if c.index > 0)
    opened = http.post(f"{cloud}/tierlink/v1/splits/fmnist-large/open", params={"cut": cut})
    assert opened.status_code == 204, opened.text
    again = http.post(f"{cloud}/tierlink/v1/splits/fmnist-large/open", params={"cut": cut})
    assert again.status_code == 204  # already open: nothing to do
    unknown = http.post(f"{cloud}/tierlink/v1/splits/nope/open", params={"cut": cut})
    assert unknown.status_code == 404 and unknown.json()["hint"]
    bad = http.post(f"{cloud}/tierlink/v1/splits/fmnist-large/open", params={"cut": "no-such"})
    assert bad.status_code == 400 and "split list" in bad.json()["hint"], bad.text
    status = http.get(f"{fleet.node_urls['dev-1']}/tierlink/v1/status").json()
    assert set(status["split_open"]) == {"fmnist-large"}
