"""Nodes watch the registry view: an answer as soon as it changes, nothing while it is
quiet (a heartbeat that repeats itself is not a change), failover between replicas."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tierlink.control.app import create_app
from tierlink.control.client import ControlClient, RegistryCache
from tierlink.control.store import SqliteRegistryStore

URL = "http://control.test:7000"


@pytest.fixture
def app(clock):
    store = SqliteRegistryStore(":memory:")
    yield create_app(store, clock=clock, ttl_s=5.0)
    store.close()


def run(app, scenario) -> None:
    async def main() -> None:
        async with ControlClient(URL, timeout_s=2.0,
                                 transport=httpx.ASGITransport(app=app)) as client:
            await scenario(client)
    asyncio.run(main())


def test_unchanged_until_a_heartbeat_carries_something_new(app, make_body):
    async def scenario(client: ControlClient) -> None:
        await client.heartbeat(make_body())
        nodes, revision = await client.nodes_since(None)
        assert [n["node_id"] for n in nodes] == ["edge-1"] and revision
        await client.heartbeat(make_body())  # the same state again: not a change
        started = time.monotonic()
        assert await client.nodes_since(revision, wait_s=0.3) == (None, revision)
        assert time.monotonic() - started >= 0.25

        async def later() -> None:
            await asyncio.sleep(0.2)
            await client.heartbeat(make_body(queue_depth=5))

        started = time.monotonic()
        (nodes, moved), _ = await asyncio.gather(client.nodes_since(revision, wait_s=5.0),
                                                 later())
        assert time.monotonic() - started < 2.0  # woken by the change, not the timeout
        assert moved != revision and nodes[0]["queue_depth"] == 5
    run(app, scenario)


def test_a_drain_and_a_deregistration_are_changes(app, make_body):
    async def scenario(client: ControlClient) -> None:
        await client.heartbeat(make_body())
        _, first = await client.nodes_since(None)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=URL)
        await http.post("/v1/nodes/edge-1/drain")
        nodes, second = await client.nodes_since(first)
        assert nodes[0]["draining"] is True and second != first
        await client.deregister("edge-1")
        nodes, third = await client.nodes_since(second)
        assert nodes == [] and third != second
        await http.aclose()
    run(app, scenario)


def test_the_cache_keeps_its_view_on_unchanged_answers(app, make_body):
    async def scenario(client: ControlClient) -> None:
        await client.heartbeat(make_body())
        cache = RegistryCache(client)
        assert await cache.refresh() and cache.revision == 1
        view = cache.nodes
        assert await cache.refresh(wait_s=0.1) and cache.nodes is view and cache.revision == 1
        await client.heartbeat(make_body(queue_depth=3))
        assert await cache.refresh(wait_s=1.0) and cache.revision == 2
        assert cache.nodes[0]["queue_depth"] == 3
    run(app, scenario)


def test_a_bad_wait_is_refused(app):
    from fastapi.testclient import TestClient

    with TestClient(app) as http:
        assert http.get("/v1/nodes", params={"since": "x", "wait": -1}).status_code == 400
        assert http.get("/v1/nodes", params={"since": "x", "wait": 3600}).status_code == 400
        # a revision from another control plane (or before a restart) is simply "changed"
        assert http.get("/v1/nodes", params={"since": "other:1"}).json()["nodes"] == []


def test_a_stopping_control_plane_answers_its_watchers_and_expires_nobody(app, make_body):
    """Shutdown first stops the expiry sweep (heartbeats can no longer arrive) and answers
    every waiting watcher "unchanged": a replica on its way out never hands its nodes an
    emptied view."""
    async def scenario(client: ControlClient) -> None:
        async with app.router.lifespan_context(app):
            await client.heartbeat(make_body())
            _, revision = await client.nodes_since(None)
            started = time.monotonic()
            waiting = asyncio.create_task(client.nodes_since(revision, wait_s=10.0))
            await asyncio.sleep(0.2)
            await app.state.stopping()
            assert await waiting == (None, revision)
            assert time.monotonic() - started < 2.0
            await asyncio.sleep(0)
            assert app.state.sweep_task.cancelled()
            # a watcher arriving after that is answered at once too
            assert await client.nodes_since(revision, wait_s=10.0) == (None, revision)
    run(app, scenario)
