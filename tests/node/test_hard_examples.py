"""The node side of the hard-example loop: the privacy rule, which rows qualify, the
uploader's queue (bounded, retried, never raising), the dispatcher's hook and the label
parameter."""

from __future__ import annotations

import asyncio
import base64
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hard_examples_support import probs

from tierlink.core.types import Outcome, Placement, Plan, Privacy, Request, Tier
from tierlink.errors import ControlPlaneError, InvalidRequest, UpstreamUnavailable
from tierlink.fleet.config import HardExampleConfig
from tierlink.node import protocol
from tierlink.node.dispatcher import Dispatcher, RetryBudget, StepResult
from tierlink.node.hard_examples import (
    Backoff,
    HardExampleUploader,
    build_examples,
    hard_rows,
    may_export,
)

LOCAL = Placement("local", "dev-1", Tier.DEVICE, "fmnist-small", 0.9)
EDGE = Placement("remote", "edge-1", Tier.EDGE)


def request(privacy: Privacy = Privacy.ANY, rid: str = "r1") -> Request:
    return Request(rid, "fmnist", 150.0, "dev-1", privacy=privacy)


def images(batch: int) -> dict[str, np.ndarray]:
    x = np.arange(batch * 784, dtype=np.float32).reshape(batch, 1, 28, 28) / 1000.0
    return {"input": x}


# -- the privacy rule -------------------------------------------------------------------------


@pytest.mark.parametrize("privacy, store_tier, expected", [
    (Privacy.LOCAL, Tier.CLOUD, False),
    (Privacy.LOCAL, Tier.EDGE, False),
    (Privacy.LOCAL, Tier.DEVICE, False),  # the store is never the origin device
    (Privacy.SITE, Tier.CLOUD, False),
    (Privacy.SITE, Tier.EDGE, True),  # a control plane declared on-site
    (Privacy.ANY, Tier.CLOUD, True),
    (Privacy.ANY, Tier.EDGE, True),
])
def test_privacy_decides_what_may_leave(privacy: Privacy, store_tier: Tier,
                                        expected: bool) -> None:
    assert may_export(privacy, store_tier, low_confidence=True) is expected


@pytest.mark.parametrize("privacy", list(Privacy))
def test_nothing_leaves_unless_escalated_for_low_confidence(privacy: Privacy) -> None:
    assert not may_export(privacy, Tier.EDGE, low_confidence=False)


def test_only_rows_below_the_threshold_are_hard() -> None:
    assert hard_rows(probs(0.95, 0.5, 0.89, 0.9), 0.9).tolist() == [1, 2]


def test_examples_carry_prediction_confidence_label_and_their_row() -> None:
    x = images(3)["input"]
    out = build_examples("dev-1", LOCAL, request(), x, probs(0.95, 0.5, 0.6), (4, 7, -1),
                         now=123.0)
    assert [(e.row, e.prediction, e.label) for e in out] == [(1, 1, 7), (2, 2, -1)]
    assert out[0].confidence == pytest.approx(0.5) and out[0].threshold == 0.9
    np.testing.assert_array_equal(out[0].input, x[1])
    wire = out[0].to_wire()
    assert wire["input"]["shape"] == [1, 28, 28] and wire["input"]["datatype"] == "FP32"
    raw = base64.b64decode(wire["input"]["data"])
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4").reshape(1, 28, 28), x[1])
    assert wire["privacy"] == "any" and wire["created_at"] == 123.0


def test_examples_without_labels_are_unknown() -> None:
    out = build_examples("dev-1", LOCAL, request(), images(1)["input"], probs(0.3), None, 1.0)
    assert [e.label for e in out] == [-1]


# -- the uploader ---------------------------------------------------------------------------


class Sink:
    """A fake control plane: records batches, or fails while ``down``."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.down = False
        self.got = asyncio.Event()

    async def post_hard_examples(self, examples: Any) -> dict[str, int]:
        if self.down:
            raise ControlPlaneError("control plane down")
        self.batches.append(list(examples))
        self.got.set()
        return {"stored": len(examples)}

    @property
    def sent(self) -> list[dict[str, Any]]:
        return [e for batch in self.batches for e in batch]


def uploader(sink: Sink, **config: Any) -> tuple[HardExampleUploader, Counter[str]]:
    counts: Counter[str] = Counter()

    def count(outcome: str, n: int) -> None:
        counts[outcome] += n

    up = HardExampleUploader(sink, HardExampleConfig(**config), "dev-1", count=count,
                             rng=random.Random(1), wall_clock=lambda: 50.0)
    return up, counts


def offer(up: HardExampleUploader, privacy: Privacy = Privacy.ANY, rid: str = "r1",
          confidences: tuple[float, ...] = (0.5,), labels: tuple[int, ...] | None = None) -> None:
    up.offer(LOCAL, request(privacy, rid), images(len(confidences)), probs(*confidences), labels)


def test_local_and_site_inputs_are_withheld_and_never_sent() -> None:
    sink = Sink()
    up, counts = uploader(sink)
    offer(up, Privacy.LOCAL, "a")
    offer(up, Privacy.SITE, "b")
    offer(up, Privacy.ANY, "c", labels=(3,))
    assert asyncio.run(up.flush())
    assert [(e["request_id"], e["label"]) for e in sink.sent] == [("c", 3)]
    assert counts == Counter(withheld=2, queued=1, sent=1)


def test_site_inputs_go_to_a_control_plane_declared_at_the_edge() -> None:
    sink = Sink()
    up, _ = uploader(sink, store_tier=Tier.EDGE)
    offer(up, Privacy.SITE, "b")
    offer(up, Privacy.LOCAL, "a")
    asyncio.run(up.flush())
    assert [e["request_id"] for e in sink.sent] == ["b"]


def test_confident_rows_of_a_batch_stay_on_the_node() -> None:
    sink = Sink()
    up, counts = uploader(sink)
    offer(up, confidences=(0.99, 0.4, 0.95), labels=(0, 1, 2))
    asyncio.run(up.flush())
    assert [(e["row"], e["label"]) for e in sink.sent] == [(1, 1)]
    assert counts["queued"] == 1


def test_sampling_rate_zero_sends_nothing() -> None:
    sink = Sink()
    up, counts = uploader(sink, sample_rate=0.0)
    for i in range(5):
        offer(up, rid=str(i))
    assert up.pending == 0 and counts == Counter(sampled_out=5)


def test_a_full_queue_drops_the_oldest_and_counts_it() -> None:
    sink = Sink()
    up, counts = uploader(sink, max_queue=3, batch_size=10)
    for i in range(5):
        offer(up, rid=str(i))
    asyncio.run(up.flush())
    assert [e["request_id"] for e in sink.sent] == ["2", "3", "4"]
    assert counts == Counter(queued=5, dropped=2, sent=3)


def test_a_failed_upload_keeps_the_batch_in_order_for_the_retry() -> None:
    sink = Sink()
    up, counts = uploader(sink, batch_size=2)
    for i in range(3):
        offer(up, rid=str(i))
    sink.down = True
    assert asyncio.run(up.flush()) is False
    assert up.pending == 3 and up.upload_failures == 1
    sink.down = False
    assert asyncio.run(up.flush()) and asyncio.run(up.flush())
    assert [e["request_id"] for e in sink.sent] == ["0", "1", "2"]
    assert counts["upload_failed"] == 2 and counts["sent"] == 3


def test_an_offer_never_raises_into_serving() -> None:
    up, counts = uploader(Sink())
    # A malformed answer (probabilities of the wrong rank) is counted, not raised.
    up.offer(LOCAL, request(), images(1), np.zeros(3, np.float32), None)
    up.offer(LOCAL, request(), {"a": np.zeros(1), "b": np.zeros(1)}, probs(0.5), None)
    assert counts == Counter(skipped=2) and up.pending == 0


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    b = Backoff(first_s=1.0, max_s=5.0)
    assert [b.next_delay() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    b.reset()
    assert b.next_delay() == 1.0


def test_the_background_task_flushes_a_full_batch_at_once() -> None:
    async def scenario() -> list[dict[str, Any]]:
        sink = Sink()
        # A flush interval far beyond the test: only reaching batch_size can trigger it.
        up, _ = uploader(sink, batch_size=2, flush_interval_s=3600.0)
        up.start()
        offer(up, rid="a")
        offer(up, rid="b")
        await asyncio.wait_for(sink.got.wait(), 5.0)
        await up.stop()
        return sink.sent

    assert [e["request_id"] for e in asyncio.run(scenario())] == ["a", "b"]


def test_stop_sends_what_is_still_waiting() -> None:
    async def scenario() -> Sink:
        sink = Sink()
        up, _ = uploader(sink, flush_interval_s=3600.0)
        up.start()
        offer(up, rid="late")
        await up.stop()
        return sink

    assert [e["request_id"] for e in asyncio.run(scenario()).sent] == ["late"]


# -- the dispatcher's hook ------------------------------------------------------------------


def dispatcher(local_conf: float, remote: dict[str, Any] | None = None
               ) -> tuple[Dispatcher, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    remote = remote or {}

    async def local(p: Placement, req: Request, inputs: Any, remaining: float) -> StepResult:
        return StepResult({"probabilities": probs(local_conf)},
                          Outcome(p.node_id, p.tier, p.model or "", (p.node_id,), local_conf))

    async def remote_step(p: Placement, req: Request, inputs: Any, remaining: float,
                          budget: float) -> StepResult:
        behaviour = remote.get(p.node_id, 0.5)
        if isinstance(behaviour, Exception):
            raise behaviour
        return StepResult({}, Outcome(p.node_id, p.tier, "m", (p.node_id,), behaviour))

    class Breakers:
        def allow(self, n: str) -> bool:
            return True

        def success(self, n: str) -> None: ...

        def failure(self, n: str, kind: str) -> None: ...

    class Obs:
        def escalated(self, model: str) -> None: ...
        def fell_back(self, node_id: str, reason: str) -> None: ...
        def retried(self, node_id: str) -> None: ...

    def hook(p: Placement, req: Request, inputs: Any, result: StepResult) -> None:
        seen.append((p.node_id, req.request_id))

    d = Dispatcher("dev-1", Tier.DEVICE, local, remote_step, Breakers(), RetryBudget(0.0),
                   Obs(), lambda: 100.0, on_hard_example=hook)
    return d, seen


def run(d: Dispatcher, plan: Plan) -> StepResult:
    return asyncio.run(d.execute(plan, request(), images(1), 101.0))


def test_a_low_confidence_local_escalation_is_a_hard_example() -> None:
    d, seen = dispatcher(0.5)
    out = run(d, Plan((LOCAL, EDGE), "tierlink"))
    assert out.outcome.served_by == "edge-1" and seen == [("dev-1", "r1")]


def test_confident_answers_and_last_placements_are_not() -> None:
    d, seen = dispatcher(0.95)
    run(d, Plan((LOCAL, EDGE), "tierlink"))
    d2, seen2 = dispatcher(0.5)
    run(d2, Plan((LOCAL,), "tierlink"))  # nothing to escalate to: the answer is final
    assert seen == [] and seen2 == []


def test_fallbacks_and_remote_escalations_are_not_reported_here() -> None:
    # edge-1 fails (a fallback, not low confidence); edge-2 answers below its own
    # threshold and is escalated to the cloud: that hard example is edge-2's to report.
    plan = Plan((Placement("remote", "edge-1", Tier.EDGE),
                 Placement("remote", "edge-2", Tier.EDGE, escalate_below=0.9),
                 Placement("remote", "cloud-1", Tier.CLOUD)), "tierlink")
    d, seen = dispatcher(0.5, {"edge-1": UpstreamUnavailable("down"), "cloud-1": 0.99})
    out = run(d, plan)
    assert out.outcome.served_by == "cloud-1" and seen == []


# -- the label parameter --------------------------------------------------------------------


def test_labels_parse_and_travel_upstream() -> None:
    assert protocol.parse_labels({}, 1) is None
    assert protocol.parse_labels({protocol.LABEL: 7}, 1) == (7,)
    req = request()
    single = protocol.forward_params(req, 10.0, None, (7,))
    assert protocol.parse_labels(single, 1) == (7,)
    batch = protocol.forward_params(req, 10.0, None, (1, -1, 3))
    assert protocol.parse_labels(batch, 3) == (1, -1, 3)
    assert protocol.LABEL not in protocol.forward_params(req, 10.0, None)


@pytest.mark.parametrize("value, batch", [(-2, 1), (True, 1), ("3", 1), (1.5, 1), (3, 2),
                                          ("[1, 2]", 3)])
def test_a_bad_label_is_a_clear_error(value: Any, batch: int) -> None:
    with pytest.raises(InvalidRequest, match="tierlink.label"):
        protocol.parse_labels({protocol.LABEL: value}, batch)
