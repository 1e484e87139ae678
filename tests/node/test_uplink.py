"""The node's uplink: the outbox delivered over HTTP (httpx.MockTransport, no network)."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest
from uplink_support import FakeClock, FakeUpstream, make_uplink, until

from tierlink.errors import ConfigError, OutboxError
from tierlink.node.uplink import CONTROL, PARENT, Uplink, UplinkConfig, UplinkMetrics
from tierlink.outbox import Backoff


def sample(metrics: UplinkMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"tier": metrics.tier, **labels})


def test_delivers_in_order_in_the_wire_format(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream, config=UplinkConfig(batch=4))
        keys = [(await uplink.put("result", f"dev-1:{i}", {"i": i})).key for i in range(10)]
        uplink.start()
        await until(lambda: len(upstream.applied) == 10)
        assert upstream.applied == keys  # enqueue order
        assert uplink.outbox.pending() == 0
        await uplink.stop()

    asyncio.run(main())
    first = upstream.requests[0]
    assert str(first.url) == "http://edge-1.test:8001/tierlink/v1/inbox"
    assert first.headers["content-type"] == "application/json"
    body = upstream.bodies[0]
    assert body["from"] == "dev-1" and len(body["items"]) == 4  # batches of `batch`
    assert body["items"][0] == {"key": "dev-1:0", "kind": "result", "payload": {"i": 0},
                                "created_at": upstream.clock(), "chain": [],
                                "ttl_s": UplinkConfig().ttl_s}  # nothing spent yet


def test_the_control_plane_gets_the_nodes_authorization(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream, parent=False,
                             headers={CONTROL: {"authorization": "Bearer node:dev-1:s3cret"}})
        assert uplink.upstream == CONTROL  # no parent: its own items go to the control plane
        uplink.start()
        await uplink.put("telemetry", None, {"cpu": 0.5})
        await until(lambda: len(upstream.applied) == 1)
        await uplink.stop()

    asyncio.run(main())
    request = upstream.requests[0]
    assert str(request.url) == "http://control.test:7000/v1/results"
    assert request.headers["authorization"] == "Bearer node:dev-1:s3cret"


def test_a_dead_parent_is_retried_with_backoff_and_the_state_follows(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    upstream.down = True
    metrics = UplinkMetrics("device")

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream, metrics=metrics,
                             config=UplinkConfig(backoff=Backoff(base_s=0.2, max_s=5.0)))
        assert uplink.state().state == "up" and not uplink.is_down()  # nothing tried yet
        for i in range(3):
            await uplink.put("result", f"dev-1:{i}", {"i": i})
        uplink.start()
        await until(lambda: len(upstream.attempt_times) >= 5)
        down = uplink.state()
        assert (down.destination, down.state, down.waiting) == (PARENT, "down", 3)
        assert uplink.is_down()  # what every routed answer says (tierlink.uplink)
        assert down.since == upstream.attempt_times[0]
        assert "ConnectError" in (down.last_error or "")
        assert sample(metrics, "tierlink_uplink_down", destination=PARENT) == 1.0
        gaps = [b - a for a, b in itertools.pairwise(upstream.attempt_times[:5])]
        assert all(later > earlier for earlier, later in itertools.pairwise(gaps))
        assert 0.16 <= gaps[0] <= 0.24  # base 0.2 s, jitter 20%
        upstream.down = False
        await until(lambda: len(upstream.applied) == 3)
        up = uplink.state()
        assert (up.state, up.waiting, up.last_error) == ("up", 0, None)
        assert not uplink.is_down()
        assert up.since > down.since
        await uplink.stop()

    asyncio.run(main())
    assert upstream.applied == ["dev-1:0", "dev-1:1", "dev-1:2"]
    assert (sample(metrics, "tierlink_outbox_retries_total", destination=PARENT) or 0) >= 4
    assert sample(metrics, "tierlink_outbox_delivered_total", destination=PARENT,
                  kind="result") == 3


def test_an_error_status_is_transient(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    upstream.status = 503

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream)
        await uplink.put("result", "dev-1:a", {"a": 1})
        uplink.start()
        await until(lambda: len(upstream.requests) >= 2)
        assert uplink.state().state == "down"
        assert "HTTP 503" in (uplink.state().last_error or "")
        upstream.status = 200
        await until(lambda: upstream.applied == ["dev-1:a"])
        await uplink.stop()

    asyncio.run(main())


def test_rejected_items_are_dropped_and_counted(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    upstream.reject = {"dev-1:1"}
    metrics = UplinkMetrics("device")

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream, metrics=metrics)
        for i in range(3):
            await uplink.put("result", f"dev-1:{i}", {"i": i})
        uplink.start()
        await until(lambda: uplink.outbox.pending() == 0)
        assert uplink.state().state == "up"
        await uplink.stop()

    asyncio.run(main())
    assert upstream.applied == ["dev-1:0", "dev-1:2"]
    assert sample(metrics, "tierlink_outbox_dropped_total", reason="rejected") == 1
    assert sample(metrics, "tierlink_outbox_dropped_total", reason="expired") == 0


def test_waiting_items_survive_reopening_and_the_outage_is_remembered(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    upstream.down = True

    async def first_run() -> None:
        uplink = make_uplink(tmp_path, upstream)
        for i in range(4):
            await uplink.put("result", f"dev-1:{i}", {"i": i})
        uplink.start()
        await until(lambda: len(upstream.attempt_times) >= 2)
        await uplink.stop()  # nothing flushed, nothing lost

    async def second_run() -> None:
        uplink = make_uplink(tmp_path, upstream)
        assert uplink.outbox.pending(PARENT) == 4
        uplink.start()
        # The head had failed before the restart: the outage goes on until it is sent.
        assert uplink.state().state == "down"
        upstream.down = False
        await until(lambda: len(upstream.applied) == 4)
        assert uplink.state().state == "up"
        await uplink.stop()

    asyncio.run(first_run())
    asyncio.run(second_run())
    assert upstream.applied == [f"dev-1:{i}" for i in range(4)]


def test_a_repeated_key_is_stored_once(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream)
        first = await uplink.put("result", "dev-1:7", {"try": 1})
        again = await uplink.put("result", "dev-1:7", {"try": 2})  # a client's retry
        assert again.id == first.id and uplink.outbox.pending() == 1
        assert json.loads(again.payload)["payload"] == {"try": 1}
        await uplink.stop()

    asyncio.run(main())


def test_a_full_outbox_refuses_results_and_evicts_expendable_kinds(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    metrics = UplinkMetrics("device")

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream, metrics=metrics,
                             config=UplinkConfig(max_items=3))
        await uplink.put("result", "r1", {})
        await uplink.put("hard_example", "h1", {})
        await uplink.put("hard_example", "h2", {})
        await uplink.put("hard_example", "h3", {})  # evicts h1: expendable
        assert uplink.outbox.get("h1") is None
        await uplink.put("result", "r2", {})  # evicts h2: results push expendables out
        await uplink.put("result", "r3", {})  # evicts h3
        with pytest.raises(OutboxError, match="refused"):
            await uplink.put("result", "r4", {})  # results are never evicted
        assert [uplink.outbox.get(k) is not None for k in ("r1", "r2", "r3")] == [True] * 3
        await uplink.stop()

    asyncio.run(main())
    assert sample(metrics, "tierlink_outbox_dropped_total", reason="full") == 3
    assert sample(metrics, "tierlink_outbox_dropped_total", reason="refused") == 1


def test_items_go_only_where_the_node_can_deliver(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    with pytest.raises(ConfigError, match="no upstream and no control plane"):
        Uplink("dev-1", tmp_path / "a")

    async def main() -> None:
        uplink = make_uplink(tmp_path / "b", upstream, control=False)
        assert uplink.destinations == (PARENT,)
        with pytest.raises(ConfigError, match="no 'control'"):
            await uplink.put("result", None, {}, CONTROL)
        with pytest.raises(TypeError):
            await uplink.put("result", None, {"x": object()})  # not JSON: nothing stored
        assert uplink.outbox.pending() == 0
        await uplink.stop()

    asyncio.run(main())


def test_metrics_and_status_read_the_outbox(tmp_path: Path) -> None:
    from prometheus_client import generate_latest

    upstream = FakeUpstream(FakeClock())
    upstream.down = True
    metrics = UplinkMetrics("edge")

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream, metrics=metrics)
        await uplink.put("result", "k1", {"a": 1})
        await uplink.put("result", "k2", {"a": 2}, CONTROL)
        text = generate_latest(metrics.registry).decode()
        assert 'tierlink_outbox_items{destination="parent",tier="edge"} 1.0' in text
        assert 'tierlink_outbox_items{destination="control",tier="edge"} 1.0' in text
        assert 'tierlink_outbox_dropped_total{reason="full",tier="edge"} 0.0' in text
        status = uplink.status()
        assert status["outbox"]["items"] == 2
        assert status["outbox"]["by_destination"] == {"parent": 1, "control": 1}
        assert status["state"]["parent"]["state"] == "up"
        await uplink.stop()
        generate_latest(metrics.registry)  # a closed outbox reads NaN, the scrape works

    asyncio.run(main())


def test_a_dead_parent_hands_the_line_to_the_next_upstream(tmp_path: Path) -> None:
    import random

    import httpx

    clock = FakeClock()
    edges = {"edge-1.test": FakeUpstream(clock), "edge-2.test": FakeUpstream(clock)}
    edges["edge-1.test"].down = True

    def route(request: httpx.Request) -> httpx.Response:
        return edges[request.url.host].handle(request)

    async def main() -> None:
        uplink = Uplink("dev-1", tmp_path, parent_url="http://edge-1.test:8001",
                        fallback_urls=["http://edge-2.test:8002/"], clock=clock,
                        sleep=clock.sleep, rng=random.Random(0),
                        transport=httpx.MockTransport(route))
        assert uplink.status()["parents"] == ["http://edge-1.test:8001/tierlink/v1/inbox",
                                              "http://edge-2.test:8002/tierlink/v1/inbox"]
        keys = [(await uplink.put("result", f"dev-1:{i}", {"i": i})).key for i in range(3)]
        uplink.start()
        await until(lambda: edges["edge-2.test"].applied == keys)
        assert uplink.parent_url == "http://edge-2.test:8002/tierlink/v1/inbox"  # it stays
        edges["edge-1.test"].down = False
        await uplink.put("result", "dev-1:3", {"i": 3})
        await until(lambda: len(edges["edge-2.test"].applied) == 4)
        assert uplink.state(PARENT).state == "up"
        await uplink.stop()

    asyncio.run(main())
    assert len(edges["edge-1.test"].requests) == 1 and edges["edge-1.test"].applied == []


def test_with_one_parent_a_failure_retries_the_same_one(tmp_path: Path) -> None:
    upstream = FakeUpstream(FakeClock())
    upstream.down = True

    async def main() -> None:
        uplink = make_uplink(tmp_path, upstream)
        await uplink.put("result", "k1", {"a": 1})
        uplink.start()
        await until(lambda: len(upstream.attempt_times) >= 3)
        assert uplink.parent_url == "http://edge-1.test:8001/tierlink/v1/inbox"
        await uplink.stop()

    asyncio.run(main())
    assert {str(r.url) for r in upstream.requests} == {"http://edge-1.test:8001/tierlink/v1/inbox"}


def test_a_dead_control_plane_replica_hands_the_line_to_the_next(tmp_path: Path) -> None:
    import random

    import httpx

    clock = FakeClock()
    replicas = {"control-a.test": FakeUpstream(clock), "control-b.test": FakeUpstream(clock)}
    replicas["control-a.test"].down = True

    def route(request: httpx.Request) -> httpx.Response:
        return replicas[request.url.host].handle(request)

    async def main() -> None:
        uplink = Uplink("edge-1", tmp_path,
                        control_url="http://control-a.test:7000,http://control-b.test:7000",
                        clock=clock, sleep=clock.sleep, rng=random.Random(0),
                        transport=httpx.MockTransport(route))
        keys = [(await uplink.put("result", f"edge-1:{i}", {"i": i}, CONTROL)).key
                for i in range(3)]
        uplink.start()
        await until(lambda: replicas["control-b.test"].applied == keys)
        await uplink.stop()

    asyncio.run(main())
    assert replicas["control-a.test"].applied == []
