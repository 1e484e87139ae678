"""Asynchronous requests: the result goes into the uplink, the answer says so."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from uplink_support import FakeClock, FakeUpstream, make_uplink, until

from tierlink.core.types import Fallback, Outcome, Tier
from tierlink.errors import InvalidRequest
from tierlink.node.async_requests import (
    ASYNC,
    AsyncResults,
    build_result_payload,
    is_async,
    result_key,
)
from tierlink.node.uplink import CONTROL, PARENT

OUTPUTS = {"probabilities": np.array([[0.1, 0.9], [0.7, 0.3]], np.float32),
           "label": np.array([1, 0], np.int64)}
OUTCOME = Outcome("dev-1", Tier.DEVICE, "fmnist-small", ("dev-1",), 0.7,
                  fallbacks=(Fallback("edge-1", "unavailable", "connection refused"),),
                  degraded="upstream unavailable")


@pytest.mark.parametrize(("value", "expected"), [
    (None, False), (False, False), (True, True), ("true", True), ("1", True), ("no", False)])
def test_is_async_reads_the_parameter(value: object, expected: bool) -> None:
    assert is_async({} if value is None else {ASYNC: value}) is expected


def test_a_bad_async_value_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="tierlink.async must be true or false"):
        is_async({ASYNC: "later"})


def test_the_payload_summarises_the_answer() -> None:
    payload = build_result_payload("r1", "fmnist", OUTPUTS, OUTCOME, 1.23456, node_id="dev-1",
                                   uplink="down", answered_at=5.0, model_version="3")
    assert payload["predictions"] == [1, 0]
    assert payload["confidences"] == pytest.approx([0.9, 0.7])
    assert (payload["model"], payload["model_version"], payload["tier"]) == \
        ("fmnist-small", "3", "device")
    assert payload["uplink"] == "down" and payload["latency_ms"] == 1.235
    assert payload["fallbacks"] == [{"node": "edge-1", "reason": "unavailable",
                                     "detail": "connection refused"}]
    json.dumps(payload, allow_nan=False)  # JSON as it is
    unpinned = build_result_payload("r1", "fmnist", OUTPUTS, OUTCOME, 1.0, node_id="dev-1",
                                    uplink="up", answered_at=5.0)
    assert unpinned["model_version"] == (getattr(OUTCOME, "model_version", "") or None)


def test_accept_queues_the_result_toward_the_parent(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    upstream.down = True

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream)
        results = AsyncResults(uplink, clock=upstream.clock)
        first = await results.accept("r1", "fmnist", OUTPUTS, OUTCOME, 2.0)
        assert first == {"request_id": "r1", "status": "accepted", "uplink": "up",
                         "result_key": "dev-1:r1"}
        uplink.start()
        await until(lambda: uplink.state().state == "down")
        second = await results.accept("r2", "fmnist", OUTPUTS, OUTCOME, 2.0)
        assert second["uplink"] == "down"  # answered while the parent is unreachable
        item = uplink.outbox.get(result_key("dev-1", "r2"))
        assert item is not None and (item.destination, item.kind) == (PARENT, "result")
        assert json.loads(item.payload)["payload"]["uplink"] == "down"
        upstream.down = False
        await until(lambda: len(upstream.applied) == 2)
        await uplink.stop()

    asyncio.run(main())
    delivered = [i for body in upstream.bodies for i in body["items"]]
    assert [i["payload"]["request_id"] for i in delivered] == ["r1", "r2"]


def test_without_a_parent_results_go_to_the_control_plane(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream, parent=False)
        results = AsyncResults(uplink)
        assert results.destination == CONTROL
        await results.accept("r1", "fmnist", OUTPUTS, OUTCOME, 2.0)
        assert uplink.outbox.pending(CONTROL) == 1
        await uplink.stop()

    asyncio.run(main())
