"""ControlClient, RegistryCache and HeartbeatLoop against the real app, in process.

The app runs behind ``httpx.ASGITransport`` (no sockets); ``Switch`` makes it unreachable
on demand, as a crashed control plane would be.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest

from tierlink.control.app import create_app
from tierlink.control.client import FAILBACK_S, ControlClient, HeartbeatLoop, RegistryCache
from tierlink.control.store import SqliteRegistryStore
from tierlink.core.types import ClusterView, Tier
from tierlink.errors import ControlPlaneError, InvalidRequest

URL = "http://control.test:7000"


class Switch(httpx.AsyncBaseTransport):
    """The app's ASGI transport, or a refused connection while ``down``."""

    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.down = False
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return await self.inner.handle_async_request(request)


@pytest.fixture
def store() -> Iterator[SqliteRegistryStore]:
    s = SqliteRegistryStore(":memory:")
    yield s
    s.close()


@pytest.fixture
def switch(store, clock) -> Switch:
    return Switch(create_app(store, clock=clock, ttl_s=5.0))


def run(scenario: Callable[[ControlClient], Awaitable[None]], transport) -> None:
    """Run ``scenario(client)`` in a fresh loop; no task may outlive it."""

    async def main() -> None:
        client = ControlClient(URL, timeout_s=1.0, transport=transport)
        try:
            await scenario(client)
        finally:
            await client.close()
        leftover = asyncio.all_tasks() - {asyncio.current_task()}
        assert not leftover, f"leaked tasks: {leftover}"

    asyncio.run(main())


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def failing(exc: Exception) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc
    return httpx.MockTransport(handler)


# -- ControlClient -------------------------------------------------------------------------


def test_heartbeat_list_and_deregister(switch, make_body):
    async def scenario(client: ControlClient) -> None:
        await client.heartbeat(make_body())
        nodes = await client.nodes()
        assert [n["node_id"] for n in nodes] == ["edge-1"] and nodes[0]["generation"] == 1
        assert await client.deregister("edge-1") is True
        assert await client.deregister("edge-1") is False
        assert await client.nodes() == []

    run(scenario, switch)


def test_a_refused_heartbeat_carries_the_servers_message(switch, make_body):
    async def scenario(client: ControlClient) -> None:
        with pytest.raises(ControlPlaneError) as info:
            await client.heartbeat(make_body(tier="fog"))
        message = str(info.value)
        assert URL in message and "HTTP 422" in message and "tier" in message
        assert info.value.details["status"] == 422

    run(scenario, switch)


def test_a_body_without_node_id_is_refused_locally(switch):
    async def scenario(client: ControlClient) -> None:
        with pytest.raises(InvalidRequest, match="node_id"):
            await client.heartbeat({"tier": "edge"})

    run(scenario, switch)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), "cannot reach"),
        (httpx.ReadTimeout("timed out"), "did not answer the node list within 1 s"),
        (httpx.RemoteProtocolError("peer closed"), "cannot reach"),
    ],
)
def test_transport_failures_become_control_plane_errors(exc, expected):
    async def scenario(client: ControlClient) -> None:
        with pytest.raises(ControlPlaneError) as info:
            await client.nodes()
        assert expected in str(info.value) and f"{URL}/v1/nodes" in str(info.value)
        assert isinstance(info.value.__cause__, httpx.HTTPError)

    run(scenario, failing(exc))


@pytest.mark.parametrize("body", [b"not json", b'{"nodes": 3}', b"[1, 2]"])
def test_an_unexpected_answer_is_a_control_plane_error(body):
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))

    async def scenario(client: ControlClient) -> None:
        with pytest.raises(ControlPlaneError, match=URL):
            await client.nodes()

    run(scenario, transport)


# -- RegistryCache ---------------------------------------------------------------------------


def test_cache_keeps_the_last_view_through_an_outage(switch, make_body, clock):
    async def scenario(client: ControlClient) -> None:
        cache = RegistryCache(client, clock=clock)
        assert cache.stale_s(clock()) == math.inf and cache.nodes == []
        await client.heartbeat(make_body())
        assert await cache.refresh() is True
        assert (cache.revision, cache.fetched_at) == (1, clock.now)
        view = cache.nodes

        switch.down = True
        clock.advance(3.0)
        assert await cache.refresh() is False
        assert await cache.refresh() is False
        assert cache.nodes is view and cache.revision == 1
        assert (cache.failures, cache.consecutive_failures) == (2, 2)
        assert URL in (cache.last_error or "")
        assert cache.stale_s(clock()) == pytest.approx(3.0)

        switch.down = False
        assert await cache.refresh() is True  # back: the view it holds is still current
        assert (cache.failures, cache.consecutive_failures, cache.revision) == (2, 0, 1)
        assert cache.stale_s(clock()) == 0.0

    run(scenario, switch)


def test_cache_views_feed_a_cluster_view(switch, make_body, clock):
    async def scenario(client: ControlClient) -> None:
        cache = RegistryCache(client, clock=clock)
        await client.heartbeat(make_body())
        await client.heartbeat(make_body(node_id="cloud-1", tier="cloud", upstream=[],
                                         links=[], address="http://127.0.0.1:8201"))
        clock.advance(0.5)
        await cache.refresh()
        clock.advance(2.0)
        nodes, links = cache.views(clock())
        view = ClusterView.build("edge-1", nodes, links)
        assert view.me.tier is Tier.EDGE and view.me.age_s == pytest.approx(2.5)
        assert view.me.model_for("fmnist").cascade[0].answered_share == 0.8
        assert [n.node_id for n in view.upstream_of("edge-1")] == ["cloud-1"]
        assert view.link("edge-1", "cloud-1").rtt_ms == 80.0
        assert cache.addresses()["cloud-1"] == "http://127.0.0.1:8201"

    run(scenario, switch)


def _profiled(node_id: str, head_ms: float) -> dict:
    point = {"cut": "/f.2/Add_output_0", "head_ms": head_ms, "tail_ms": 9.0,
             "feature_bytes": 100_352,
             "codecs": [{"codec": "int8+zstd", "wire_bytes": 20_000, "encode_ms": 0.2,
                         "decode_ms": 0.1}]}
    model = {"name": "imagenet-mobilenetv2", "task": "imagenet", "version": "1",
             "accuracy": 0.718, "latency_ms": 14.0, "splits": [point]}
    return {"node_id": node_id, "models": [model]}


def test_split_profiles_travel_by_digest_and_are_fetched_once(switch, make_body, clock):
    async def scenario(client: ControlClient) -> None:
        cache = RegistryCache(client, clock=clock)
        for node_id in ("edge-1", "edge-2"):  # the same profile on two nodes
            await client.heartbeat(make_body(**_profiled(node_id, 3.6)))
        for _ in range(3):
            assert await cache.refresh() is True
        assert switch.paths.count("/v1/nodes") == 3
        assert len([p for p in switch.paths if p.startswith("/v1/splits/")]) == 1
        nodes, _ = cache.views(clock())
        assert [n.models[0].splits[0].head_ms for n in nodes] == [3.6, 3.6]
        assert "splits" not in cache.nodes[0]["models"][0]  # the digest came instead
        await client.heartbeat(make_body(**_profiled("edge-2", 5.0)))  # a new profile
        assert await cache.refresh() is True
        nodes, _ = cache.views(clock())
        assert [n.models[0].splits[0].head_ms for n in nodes] == [3.6, 5.0]
        assert len([p for p in switch.paths if p.startswith("/v1/splits/")]) == 2
        # Plain readers (an operator, an older node) still get the profiles inline.
        full = await client.nodes()
        assert full[0]["models"][0]["splits"][0]["head_ms"] == 3.6

    run(scenario, switch)


def test_a_profile_that_cannot_be_fetched_keeps_the_previous_view(switch, make_body, clock):
    async def scenario(client: ControlClient) -> None:
        cache = RegistryCache(client, clock=clock)
        await client.heartbeat(make_body(**_profiled("edge-1", 3.6)))
        assert await cache.refresh() is True
        view = cache.nodes
        with pytest.raises(ControlPlaneError, match="no alive node reports"):
            await client.split_profile("0" * 32)
        await client.heartbeat(make_body(**_profiled("edge-1", 4.0)))
        switch.inner.app.state.registry.store._profiles.clear()  # one it no longer has
        assert await cache.refresh() is False and cache.nodes is view
        assert "split profile" in (cache.last_error or "")

    run(scenario, switch)


# -- HeartbeatLoop ---------------------------------------------------------------------------


def test_loop_survives_an_outage_and_logs_it_once(switch, make_body, store, clock, caplog):
    caplog.set_level(logging.INFO, logger="tierlink.control.client")

    async def scenario(client: ControlClient) -> None:
        cache = RegistryCache(client, clock=clock)
        loop = HeartbeatLoop(client, cache)
        depth = iter(range(10_000))
        loop.start(lambda: make_body(queue_depth=next(depth)), interval_s=0.01)
        await until(lambda: loop.sent >= 2 and cache.revision >= 2)

        switch.down = True
        await until(lambda: loop.failures >= 5 and cache.failures >= 5)
        assert loop.running and loop.outages == 1
        assert [n["node_id"] for n in cache.nodes] == ["edge-1"]  # still served

        switch.down = False
        sent = loop.sent
        await until(lambda: loop.sent > sent)
        assert loop.outages == 1

        await loop.stop()
        assert not loop.running
        assert store.get("edge-1", clock()) is None  # deregistered

    run(scenario, switch)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "outage 1" in warnings[0].getMessage()
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_loop_survives_a_failing_body_source(switch, make_body):
    async def scenario(client: ControlClient) -> None:
        calls = 0

        def body() -> dict:
            nonlocal calls
            calls += 1
            if calls % 2:
                raise RuntimeError("load probe failed")
            return make_body()

        loop = HeartbeatLoop(client)
        loop.start(body, interval_s=0.01)
        await until(lambda: loop.sent >= 2 and loop.failures >= 2)
        assert loop.running
        with pytest.raises(RuntimeError, match="already running"):
            loop.start(body)
        await loop.stop()

    run(scenario, switch)


def test_stop_with_the_control_plane_down_does_not_raise(switch, make_body):
    async def scenario(client: ControlClient) -> None:
        loop = HeartbeatLoop(client)
        loop.start(make_body, interval_s=0.01)
        await until(lambda: loop.sent >= 1)
        switch.down = True
        await loop.stop()  # the deregistration fails, quietly
        assert not loop.running

    run(scenario, switch)


def test_a_call_moves_to_the_next_replica_when_one_is_down(store, clock, make_body):
    """``base_url`` lists replicas: a refused connection hands the call to the next one,
    which is then asked first."""
    down, up = Switch(create_app(store, clock=clock)), Switch(create_app(store, clock=clock))
    down.down = True

    class Router(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            target = down if request.url.host == "replica-a.test" else up
            return await target.handle_async_request(request)

    async def main() -> None:
        client = ControlClient("http://replica-a.test:7000, http://replica-b.test:7000",
                               timeout_s=1.0, transport=Router())
        try:
            assert client.replicas == ("http://replica-a.test:7000",
                                       "http://replica-b.test:7000")
            answer = await client.heartbeat(make_body())
            assert answer["generation"] == 1 and client.failovers == 1
            assert client.base_url == "http://replica-b.test:7000"
            await client.heartbeat(make_body())  # straight to b now
            assert client.failovers == 1 and len(up.paths) == 2
            up.down = True  # both down: the error names the last one tried
            with pytest.raises(ControlPlaneError, match="replica-a.test"):
                await client.nodes()
        finally:
            await client.close()

    asyncio.run(main())


def test_nodes_spread_over_the_replicas_and_come_back_to_their_own(store, clock, make_body):
    """With ``home`` (a node's id) a node starts at the replica its id hashes to; moved
    away by a failure, it tries its own again once ``FAILBACK_S`` has passed."""
    a, b = Switch(create_app(store, clock=clock)), Switch(create_app(store, clock=clock))

    class Router(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            target = a if request.url.host == "replica-a.test" else b
            return await target.handle_async_request(request)

    urls = "http://replica-a.test:7000,http://replica-b.test:7000"
    homes = {ControlClient(urls, home=f"dev-{i}").home for i in range(12)}
    assert homes == {"http://replica-a.test:7000", "http://replica-b.test:7000"}
    node = next(f"dev-{i}" for i in range(12)
                if ControlClient(urls, home=f"dev-{i}").home.startswith("http://replica-a"))
    now = [0.0]

    async def main() -> None:
        client = ControlClient(urls, transport=Router(), home=node, clock=lambda: now[0])
        try:
            a.down = True
            await client.heartbeat(make_body())
            assert client.base_url.startswith("http://replica-b") and client.failovers == 1
            a.down, tried = False, len(a.paths)
            now[0] += FAILBACK_S - 1
            await client.nodes()  # not yet: b still
            assert client.base_url.startswith("http://replica-b") and len(a.paths) == tried
            now[0] += 1
            await client.nodes()  # its own replica again
            assert client.base_url.startswith("http://replica-a") and len(a.paths) == tried + 1
        finally:
            await client.close()

    asyncio.run(main())
