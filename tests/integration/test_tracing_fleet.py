"""One request's spans through three real node processes, device to edge to cloud, sent
over OTLP to the receiver the fleet starts (`tracing: {collect: true}`), form one tree with
every stage where it happened; `tierlink trace show` draws it."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from tierlink.cli.main import app
from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled
from tierlink.telemetry.trace_view import SpanRecord, find_trace, load_spans, ordered

from .integration_support import infer

pytestmark = pytest.mark.integration

FLEET = """
name: itest-tracing
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
tracing: {collect: true}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.99999, fmnist-medium: 0.9}  # the edge answers what it is sure of
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,   tier: device, models: [fmnist-small]}
links:
  - {from: dev-1, to: edge-1, delay_ms: 2}
  - {from: edge-1, to: cloud-1, delay_ms: 5}
"""
TRACE_ID = "5ca1ab1e" * 4
CLIENT_SPAN = "c0ffee00c0ffee00"


def spans_of(fleet: RunningFleet, trace_id: str, nodes: set[str]) -> list[SpanRecord]:
    """The trace's spans once every one of ``nodes`` has exported its route span, the last
    of its spans to end (each node exports its own batch every 0.5 s)."""
    assert fleet.traces_file is not None
    deadline = time.monotonic() + 15.0
    group: list[SpanRecord] = []
    while time.monotonic() < deadline:
        if fleet.traces_file.exists():
            spans = [s for s in load_spans([fleet.traces_file]) if s.trace_id == trace_id]
            group = spans
            if {s.service for s in spans if s.name == "tierlink.route"} >= nodes:
                return find_trace(spans, trace_id)
        time.sleep(0.2)
    raise AssertionError(f"spans of {len({s.service for s in group})} services arrived: "
                         f"{sorted((s.service, s.name) for s in group)}")


def test_one_request_is_one_trace_from_device_to_cloud(
        start_fleet: Callable[[str], RunningFleet], http: httpx.Client, fmnist_test: Labelled,
        cloud_samples: np.ndarray) -> None:
    fleet = start_fleet(FLEET)
    x = fmnist_test.input[cloud_samples[0]: cloud_samples[0] + 1]
    answer = infer(http, fleet.node_urls["dev-1"], "fmnist", x, {
        "tierlink.privacy": "any", "tierlink.deadline_ms": 5000.0,
        "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
    assert answer.status == 200, answer.error
    assert answer.path == ["dev-1", "edge-1", "cloud-1"], answer.parameters

    group = spans_of(fleet, TRACE_ID, {"dev-1", "edge-1", "cloud-1"})
    tree = [(depth, s.service, s.name) for depth, s in ordered(group)]
    by_id = {s.span_id: s for s in group}

    def parent(s: SpanRecord) -> SpanRecord:
        assert s.parent_id in by_id, (s.name, s.service, tree)
        return by_id[s.parent_id]

    routes = {s.service: s for s in group if s.name == "tierlink.route"}
    assert set(routes) == {"dev-1", "edge-1", "cloud-1"}, tree
    assert routes["dev-1"].parent_id == CLIENT_SPAN  # the client's span: the trace is theirs
    # Each upstream node's route span hangs under the call that reached it.
    for child, caller in (("edge-1", "dev-1"), ("cloud-1", "edge-1")):
        call = parent(routes[child])
        assert (call.name, call.service) == ("tierlink.upstream", caller), tree
        assert call.attributes["tierlink.peer"] == child
        assert parent(call) is routes[caller]
    for node in ("dev-1", "edge-1", "cloud-1"):
        mine = [s for s in group if s.service == node]
        (plan,) = [s for s in mine if s.name == "tierlink.plan"]
        assert parent(plan) is routes[node] and plan.attributes["tierlink.plan"]
        if plan.attributes["tierlink.plan"].startswith(f"{node}:local"):  # it ran its model
            for stage in ("tierlink.queue", "tierlink.compute"):
                (span,) = [s for s in mine if s.name == stage]
                assert parent(span) is routes[node]
    # The edge answered below its threshold and went on to the cloud, which answered.
    (escalation,) = [s for s in group if s.name == "tierlink.escalation"
                     and s.service == "edge-1"]
    assert escalation.attributes["tierlink.escalate"] is True
    assert escalation.attributes["tierlink.next"] == "cloud-1"
    assert {s.name for s in group if s.service == "cloud-1"} >= {"tierlink.queue",
                                                                 "tierlink.compute"}
    # One request keeps one id from hop to hop.
    assert len({s.attributes["tierlink.request_id"] for s in routes.values()}) == 1
    assert routes["dev-1"].attributes["tierlink.served_by"] == "cloud-1"
    assert routes["dev-1"].attributes["tierlink.escalations"] >= 1
    # Children lie within their parents in time (one clock on this machine).
    for s in group:
        if s.parent_id in by_id:
            p = by_id[s.parent_id]
            assert p.start_ns - 1_000_000 <= s.start_ns <= s.end_ns <= p.end_ns + 1_000_000

    shown = CliRunner().invoke(app, ["trace", "show", TRACE_ID[:12], "-f",
                                     str(fleet.traces_file)])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[0].startswith(f"trace {TRACE_ID} · {len(group)} spans · "
                                                   "3 services")
    listed = CliRunner().invoke(app, ["trace", "list", "-f", str(fleet.traces_file), "--json"])
    assert listed.exit_code == 0 and TRACE_ID in listed.output
