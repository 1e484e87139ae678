"""Hard examples through the node's durable outbox: what goes in (kind, destination, key,
payload), that it survives a restart during an outage, that a retried batch stores nothing
twice, that a full outbox evicts the oldest, and which nodes use it."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from hard_examples_support import probs
from uplink_support import FakeClock, FakeUpstream, make_uplink, until

from tierlink.core.types import Placement, Privacy, Request, Tier
from tierlink.fleet.config import HardExampleConfig
from tierlink.models.runtime import FakeModel, ModelInfo, ModelRuntime
from tierlink.node.hard_examples import (
    KIND,
    HardExampleUploader,
    OutboxSink,
    build_examples,
    example_key,
)
from tierlink.node.service import NodeService
from tierlink.node.spec import NodeSpec
from tierlink.node.uplink import CONTROL, Uplink, UplinkConfig, UplinkMetrics

LOCAL = Placement("local", "dev-1", Tier.DEVICE, "fmnist-small", 0.9)


def offer(up: HardExampleUploader, rid: str, confidences: tuple[float, ...] = (0.5,)) -> None:
    x = np.arange(len(confidences) * 784, dtype=np.float32).reshape(-1, 1, 28, 28)
    up.offer(LOCAL, Request(rid, "fmnist", 150.0, "dev-1", privacy=Privacy.ANY), {"input": x},
             probs(*confidences), None)


def uploader(uplink: Uplink, **config: Any) -> tuple[HardExampleUploader, Counter[str]]:
    counts: Counter[str] = Counter()

    def count(outcome: str, n: int) -> None:
        counts[outcome] += n

    up = HardExampleUploader(OutboxSink(uplink), HardExampleConfig(**config), "dev-1",
                             count=count, rng=random.Random(1), wall_clock=lambda: 50.0,
                             eager=True)
    return up, counts


def delivered(upstream: FakeUpstream) -> list[dict[str, Any]]:
    return [item for body in upstream.bodies for item in body["items"]]


# -- the key --------------------------------------------------------------------------------


def test_the_key_tells_apart_what_the_control_plane_store_tells_apart() -> None:
    base = ("dev-1", "r1", "fmnist-small", 0, 50.0)
    key = example_key(*base)
    assert key == example_key(*base) and key.startswith("dev-1:r1:0:")
    others = {example_key("dev-1", "r1", "fmnist-small", 1, 50.0),  # another row
              example_key("dev-1", "r1", "fmnist-medium", 0, 50.0),  # another model
              example_key("dev-1", "r1", "fmnist-small", 0, 50.5),  # the request id reused
              example_key("dev-2", "r1", "fmnist-small", 0, 50.0)}
    assert len(others) == 4 and key not in others


def test_the_key_stays_within_the_wire_limit_whatever_the_request_id() -> None:
    long_a, long_b = "a" * 500, "a" * 499 + "b"
    key_a = example_key("d" * 63, long_a, "m", 7, 1.0)
    assert len(key_a) <= 160
    assert key_a != example_key("d" * 63, long_b, "m", 7, 1.0)  # the digest covers it all


# -- the outbox path ------------------------------------------------------------------------


def test_each_example_becomes_a_hard_example_item_toward_the_control_plane(
        tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())

    async def main() -> tuple[list[dict[str, Any]], Counter[str]]:
        uplink = make_uplink(tmp_path, upstream)  # a parent too: hard examples skip it
        up, counts = uploader(uplink, flush_interval_s=3600.0)  # eager: no timer needed
        uplink.start()
        up.start()
        offer(up, "r1", (0.5, 0.95, 0.4))  # rows 0 and 2 are hard
        await until(lambda: len(upstream.applied) == 2)
        await up.stop()
        await uplink.stop()
        return delivered(upstream), counts

    items, counts = asyncio.run(main())
    assert {r.url.path for r in upstream.requests} == {"/v1/results"}  # never the parent
    assert [(i["kind"], i["payload"]["row"]) for i in items] == [(KIND, 0), (KIND, 2)]
    for item in items:
        p = item["payload"]
        assert item["key"] == example_key("dev-1", "r1", "fmnist-small", p["row"], 50.0)
        assert (p["node_id"], p["request_id"], p["privacy"], p["created_at"]) == \
            ("dev-1", "r1", "any", 50.0)
        assert p["input"]["shape"] == [1, 28, 28] and p["input"]["datatype"] == "FP32"
        assert item.get("chain", []) == []  # straight from the node, not relayed
    assert counts == Counter(queued=2, sent=2)


def test_examples_survive_a_restart_during_an_outage(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    upstream.down = True

    async def before_restart() -> None:
        uplink = make_uplink(tmp_path, upstream, parent=False)
        up, counts = uploader(uplink)
        uplink.start()
        up.start()
        offer(up, "r1")
        offer(up, "r2")
        await until(lambda: uplink.outbox.pending(CONTROL) == 2 and up.pending == 0)
        await until(lambda: uplink.state(CONTROL).state == "down")
        await up.stop()
        await uplink.stop()  # the node goes away; the control plane never got them
        assert counts["sent"] == 2

    async def after_restart() -> None:
        upstream.down = False
        uplink = make_uplink(tmp_path, upstream, parent=False)
        uplink.start()
        await until(lambda: uplink.outbox.pending(CONTROL) == 0)
        await uplink.stop()

    asyncio.run(before_restart())
    assert upstream.applied == []
    asyncio.run(after_restart())
    assert sorted(i["payload"]["request_id"] for i in delivered(upstream)) == ["r1", "r2"]


def test_a_retried_batch_stores_nothing_twice(tmp_path: Path) -> None:
    async def main() -> None:
        uplink = make_uplink(tmp_path, FakeUpstream(FakeClock()), parent=False)
        sink = OutboxSink(uplink)  # not started: everything stays in the outbox
        x = np.zeros((1, 1, 28, 28), np.float32)
        req = Request("r1", "fmnist", 150.0, "dev-1", privacy=Privacy.ANY)
        batch = [e.to_wire() for e in build_examples("dev-1", LOCAL, req, x, probs(0.5),
                                                     None, now=50.0)]
        await sink.post_hard_examples(batch)
        await sink.post_hard_examples(batch)  # the uploader's retry after a lost answer
        assert uplink.outbox.pending(CONTROL) == 1
        item = uplink.outbox.get(example_key("dev-1", "r1", "fmnist-small", 0, 50.0))
        assert item is not None and item.kind == KIND
        assert json.loads(item.payload)["payload"] == batch[0]
        await uplink.stop()

    asyncio.run(main())


def test_a_full_outbox_evicts_the_oldest_hard_examples(tmp_path: Path) -> None:
    async def main() -> None:
        metrics = UplinkMetrics("device")
        uplink = make_uplink(tmp_path, FakeUpstream(FakeClock()), parent=False,
                             config=UplinkConfig(max_items=2), metrics=metrics)
        up, counts = uploader(uplink)
        for rid in ("r1", "r2", "r3"):
            offer(up, rid)
        assert await up.flush()
        waiting = [uplink.outbox.get(example_key("dev-1", rid, "fmnist-small", 0, 50.0))
                   for rid in ("r1", "r2", "r3")]
        assert [w is not None for w in waiting] == [False, True, True]
        assert metrics.registry.get_sample_value(
            "tierlink_outbox_dropped_total", {"tier": "device", "reason": "full"}) == 1
        assert counts == Counter(queued=3, sent=3)
        await uplink.stop()

    asyncio.run(main())


# -- which nodes use it ---------------------------------------------------------------------


class Sink:
    async def post_hard_examples(self, examples: Any) -> None: ...


def service(uplink: Uplink | None, sink: Sink | None) -> NodeService:
    info = ModelInfo("fmnist-small", "fmnist", "1", accuracy=0.9, latency_ms=0.5)
    model = cast(ModelRuntime, FakeModel(info))  # the package's fake stands in for one
    return NodeService(NodeSpec("dev-1", Tier.DEVICE, ()), {"fmnist-small": model},
                       hard_example_sink=sink, uplink=uplink)


@pytest.mark.parametrize(("has_uplink", "control", "sink", "expected"), [
    (True, True, True, "outbox"),
    (True, True, False, "outbox"),  # the outbox needs no direct client
    (True, False, True, "direct"),  # an uplink to the parent only: hard examples go direct
    (False, False, True, "direct"),  # no state_dir: as before
    (False, False, False, None),
])
def test_a_node_with_an_uplink_to_the_control_plane_uses_the_outbox(
        tmp_path: Path, has_uplink: bool, control: bool, sink: bool,
        expected: str | None) -> None:
    uplink = make_uplink(tmp_path, FakeUpstream(FakeClock()), control=control) \
        if has_uplink else None
    node = service(uplink, Sink() if sink else None)
    try:
        up = node.hard_examples
        kind = None if up is None else "outbox" if up.eager else "direct"
        assert kind == expected
    finally:
        asyncio.run(node.stop())
