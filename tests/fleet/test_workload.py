"""The demo's workloads and their summaries: the photo workload's items, what an answer's
parameters become in a record (split plan, timings), and the split summary's figures."""

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest

from tierlink.core.types import Outcome, Privacy, Tier
from tierlink.errors import DeadlineExceeded
from tierlink.fleet.workload import (
    PHOTO_PRIVACY,
    PHOTO_SLA,
    Record,
    WorkItem,
    _send,
    make_photo_workload,
    summarize_split,
)
from tierlink.node import protocol


def item(seq: int = 0, origin: str = "dev-1", sample: int = 0) -> WorkItem:
    deadline, priority = PHOTO_SLA
    return WorkItem(seq, sample, origin, deadline, priority, PHOTO_PRIVACY, 0.0)


def record(origin: str = "dev-1", served_by: str = "edge-1", split: str = "", pred: int = 1,
           label: int = 1, latency: float = 50.0, answered: bool = True,
           timings: dict | None = None, error: str = "") -> Record:
    return Record(item(origin=origin), label, answered, False, error, latency, pred=pred,
                  tier="edge" if answered else "", served_by=served_by if answered else "",
                  split=split, timings=timings or {})


def test_photo_items_take_turns_at_a_steady_rate_and_are_seeded():
    items = make_photo_workload(6, 4.0, ["dev-1", "dev-2"], 100, seed=3)
    assert [i.origin for i in items] == ["dev-1", "dev-2"] * 3
    assert [i.at_s for i in items] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    assert all(i.privacy is Privacy.SITE and (i.deadline_ms, i.priority) == PHOTO_SLA
               for i in items)
    assert all(0 <= i.sample < 100 for i in items)
    assert items == make_photo_workload(6, 4.0, ["dev-1", "dev-2"], 100, seed=3)


def test_a_record_says_how_it_was_served():
    assert record(split="features.4/fp16").kind == "split"
    assert record(served_by="dev-1").kind == "local"
    assert record(served_by="edge-2").kind == "remote"


class FakeClient:
    """Answers like a node: the outcome's parameters as ``outcome_params`` writes them."""

    def __init__(self, outcome: Outcome | None, timings: object = None) -> None:
        self.outcome, self.timings = outcome, timings
        self.params: dict = {}

    async def infer(self, url, task, inputs, params, timeout_s):
        self.params = params
        if self.outcome is None:
            raise DeadlineExceeded("too late", status=504)
        answer = protocol.outcome_params(self.outcome, server_ms=12.0)
        if self.timings is not None:
            answer[protocol.TIMINGS] = self.timings
        return SimpleNamespace(outputs={"label": np.array([7])}, parameters=answer)


def send(client: FakeClient) -> Record:
    images, labels = np.zeros((2, 3, 4, 4), np.float32), np.array([7, 3])
    return asyncio.run(_send(client, item(), images, labels, "http://dev-1", "imagenet", None,
                             1.0, send_labels=False))


def test_a_split_answer_keeps_its_plan_and_timings():
    timings = {"head_ms": 11.5, "split_bytes": 50331.0, "est_ms": 30.0}
    outcome = Outcome("edge-1", Tier.EDGE, "imagenet-mobilenetv2", ("dev-1", "edge-1"), 0.9,
                      split="features.4/fp16", timings_ms=timings)
    client = FakeClient(outcome)
    got = send(client)
    assert got.answered and got.pred == 7 and got.correct and got.kind == "split"
    assert got.split == "features.4/fp16" and got.timings == timings
    assert protocol.LABEL not in client.params  # reference answers are not ground truth


@pytest.mark.parametrize("raw", ["not json", json.dumps([1, 2]), json.dumps({"a": "x"})])
def test_unreadable_timings_are_left_out(raw):
    outcome = Outcome("edge-1", Tier.EDGE, "m", ("dev-1", "edge-1"), 0.9)
    assert send(FakeClient(outcome, timings=raw)).timings == {}


def test_a_refused_request_is_recorded_with_its_code():
    got = send(FakeClient(None))
    assert not got.answered and not got.lost and got.error == "deadline_exceeded"


def test_the_split_summary_counts_plans_kinds_and_agreement():
    head = {"head_ms": 10.0, "encode_ms": 1.0, "tail_rtt_ms": 30.0, "tail_ms": 8.0,
            "split_bytes": 50000.0, "est_ms": 28.0}
    records = [record(split="features.4/fp16", latency=60.0, timings=head),
               record(split="features.4/fp16", latency=80.0, timings={**head, "head_ms": 20.0}),
               record(split="features.2/fp16", latency=70.0, pred=5, timings=head),
               record(origin="dev-2", latency=120.0),
               record(origin="dev-2", answered=False, error="deadline_exceeded")]
    s = summarize_split(records)
    assert (s["requests"], s["answered"], s["refused"], s["lost"]) == (5, 4, 1, 0)
    assert s["served"] == {"split": 3, "local": 0, "remote": 1}
    assert s["split_plans"] == {"features.4/fp16": 2, "features.2/fp16": 1}
    assert s["by_origin"] == {"dev-1": {"split": 3}, "dev-2": {"remote": 1}}
    assert s["by_kind"]["split"]["requests"] == 3 and s["by_kind"]["split"]["p50_ms"] == 70.0
    assert s["by_kind"]["remote"]["p50_ms"] == 120.0 and "local" not in s["by_kind"]
    assert s["agreement_top1"] == 0.75 and s["split_agreement_top1"] == pytest.approx(2 / 3)
    assert s["split_medians"]["head_ms"] == 10.0 and s["split_medians"]["after_head_ms"] == 31.0
    assert s["split_medians"]["split_bytes"] == 50000.0
    assert s["sla_attainment"] == 0.8 and s["errors"] == {"deadline_exceeded": 1}
    json.dumps(s)  # the report is plain JSON


def test_the_split_summary_of_a_run_that_answered_nothing():
    s = summarize_split([record(answered=False, error="no_feasible_placement")])
    assert s["answered"] == 0 and s["p50_ms"] is None and s["agreement_top1"] is None
    assert s["by_kind"] == {} and set(s["split_medians"].values()) == {None}
    assert s["errors"] == {"no_feasible_placement": 1}
