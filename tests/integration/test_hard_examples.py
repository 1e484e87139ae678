"""The hard-example loop across real processes: judged by what the control plane received.

A device (cascade threshold 0.9 on a weak model) escalates to an edge; the control plane is
at its default tier, the cloud. Requests of every privacy level are sent with their true
label. The control plane must hold exactly the `any` inputs the device escalated for low
confidence, labelled, and nothing else: no `local` or `site` input, no confident one.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled
from tierlink.transport.oip import HEADER_LENGTH, decode_infer_response, encode_infer_request

from .integration_support import Models, least_confident, metric_sum, wait_for

pytestmark = pytest.mark.integration

FLEET = """
name: itest-hard-examples
seed: 5
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  thresholds: {fmnist-small: 0.9}
hard_examples: {flush_interval_s: 0.2}
nodes:
  - {id: edge-1, tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,  tier: device, models: [fmnist-small]}
links:
  - {from: dev-1, to: edge-1, delay_ms: 1}
"""
HARD = "tierlink_hard_examples_total"


@dataclass(frozen=True)
class Sent:
    request_id: str
    sample: int
    privacy: str
    label: int
    escalated: bool  # the device answered below its threshold and passed it on
    path: list[str]


def send(http: httpx.Client, url: str, data: Labelled, sample: int, privacy: str,
         request_id: str) -> Sent:
    label = int(data.labels[sample])
    params = {"tierlink.privacy": privacy, "tierlink.deadline_ms": 3000.0,
              "tierlink.label": label}
    body, headers = encode_infer_request({"input": data.input[sample: sample + 1]}, params,
                                         None, request_id=request_id)
    resp = http.post(f"{url}/v2/models/fmnist/infer", content=body, headers=headers)
    assert resp.status_code == 200, resp.text
    header = resp.headers.get(HEADER_LENGTH)
    out = decode_infer_response(resp.content, None if header is None else int(header))
    p: dict[str, Any] = dict(out.parameters or {})
    path = list(json.loads(p["tierlink.path"]))
    assert not p["tierlink.degraded"], p  # every escalation must have been tried
    return Sent(request_id, sample, privacy, label, int(p["tierlink.escalations"]) > 0, path)


def test_only_escalated_any_inputs_reach_the_control_plane(
        start_fleet: Any, zoo_models: Models, fmnist_test: Labelled, http: httpx.Client) -> None:
    fleet: RunningFleet = start_fleet(FLEET)
    ranked = least_confident(zoo_models["fmnist-small"][0], fmnist_test.input, 1000)
    unsure, sure = ranked[:36], ranked[-8:]  # by the device model's raw confidence
    url = fleet.node_urls["dev-1"]
    groups = {"any-unsure": ("any", unsure[:16]), "site": ("site", unsure[16:26]),
              "local": ("local", unsure[26:36]), "any-sure": ("any", sure)}
    sent = [send(http, url, fmnist_test, int(s), privacy, f"{name}-{i}")
            for name, (privacy, group) in groups.items() for i, s in enumerate(group)]
    ids = [s.request_id for s in sent]
    assert len(set(ids)) == len(ids)

    expected = {s.request_id: s for s in sent if s.privacy == "any" and s.escalated}
    site_escalated = [s for s in sent if s.privacy == "site" and s.escalated]
    assert expected, "no `any` request escalated: the test proves nothing"
    assert site_escalated, "no `site` request escalated: the test proves nothing"
    assert any(s.privacy == "any" and not s.escalated for s in sent), "no confident answer"
    assert all(s.path == ["dev-1"] for s in sent if s.privacy == "local")

    control = fleet.control_url
    wait_for(lambda: len(_stored(http, control, fleet.admin_headers)) >= len(expected), 15.0,
             "the escalated `any` inputs to reach the control plane")
    # The device has nothing left to send: what is stored now is all it ever will send.
    dev = fleet.node_urls["dev-1"]
    wait_for(lambda: metric_sum(http, dev, "tierlink_hard_examples_pending") == 0, 5.0,
             "the device's hard-example queue to drain")
    stored = _stored(http, control, fleet.admin_headers)

    assert sorted(e["request_id"] for e in stored) == sorted(expected)
    for e in stored:
        s = expected[e["request_id"]]
        assert (e["node_id"], e["model"], e["privacy"]) == ("dev-1", "fmnist-small", "any")
        assert e["label"] == s.label and e["confidence"] < 0.9 and e["threshold"] == 0.9
        assert e["shape"] == [1, 28, 28] and e["datatype"] == "FP32"
    assert metric_sum(http, dev, HARD, outcome="sent") == len(expected)
    assert metric_sum(http, dev, HARD, outcome="withheld") == len(site_escalated)
    assert metric_sum(http, fleet.node_urls["edge-1"], HARD) == 0  # nothing to escalate to

    # The export holds the very inputs that were sent, with their labels.
    export = http.get(f"{control}/v1/hard-examples/export", params={"model": "fmnist-small"},
                      headers=fleet.admin_headers)
    with np.load(io.BytesIO(export.content), allow_pickle=False) as npz:
        by_id = dict(zip(npz["request_ids"].tolist(), range(len(npz["ids"])), strict=True))
        assert set(by_id) == set(expected)
        for rid, row in by_id.items():
            s = expected[rid]
            np.testing.assert_array_equal(npz["inputs"][row], fmnist_test.input[s.sample])
            assert npz["labels"][row] == s.label


def _stored(http: httpx.Client, control: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    page = http.get(f"{control}/v1/hard-examples", params={"limit": 1000}, headers=headers)
    page.raise_for_status()
    return list(page.json()["examples"])
