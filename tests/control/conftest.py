"""Shared helpers for the control plane tests: a fake clock, heartbeat bodies, and stores
of each kind."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from repo_support import FakeClock

_BODY: dict[str, Any] = {
    "node_id": "edge-1",
    "tier": "edge",
    "address": "http://127.0.0.1:8101",
    "models": [{
        "name": "fmnist-medium", "task": "fmnist", "version": "1", "accuracy": 0.925,
        "latency_ms": 0.9, "output_bytes": 64,
        "cascade": [{"threshold": 0.9, "answered_share": 0.8, "answered_accuracy": 0.97}],
    }],
    "queue_depth": 0,
    "inflight": 0,
    "workers": 1,
    "upstream": ["cloud-1"],
    "links": [{"dst": "cloud-1", "rtt_ms": 80.0, "bandwidth_mbit": 50.0, "loss": 0.0}],
    "started_at": 1_733_139_000.0,
    "software": "0.1.0",
}


def heartbeat_body(**overrides: Any) -> dict[str, Any]:
    """A valid heartbeat body (edge-1 → cloud-1) with top-level fields overridden."""
    body = copy.deepcopy(_BODY)
    body.update(overrides)
    return body


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> Iterator[Any]:
    """An in-memory SQLite registry, closed afterwards."""
    from tierlink.control.store import SqliteRegistryStore

    s = SqliteRegistryStore(":memory:")
    yield s
    s.close()


@pytest.fixture
def make_body() -> Any:
    """``make_body(**overrides)``: see :func:`heartbeat_body`."""
    return heartbeat_body


@pytest.fixture(params=["sqlite", "etcd"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """Run a test on each store behind the control plane: SQLite and etcd."""
    return str(request.param)


@pytest.fixture
def make_results(store_kind: str, request: pytest.FixtureRequest,
                 tmp_path: Any) -> Iterator[Callable[..., Any]]:
    """``make_results(**options)``: a fresh delivered-result store of ``store_kind`` (the
    etcd ones on the session's cluster, each under a prefix of its own)."""
    from tierlink.control.results import ResultStore

    made: list[Any] = []
    clients: list[Any] = []

    def make(**options: Any) -> Any:
        options.setdefault("clock", lambda: 1_733_140_000.0)
        if store_kind == "sqlite":
            store: Any = ResultStore(tmp_path / f"control-{len(made)}.db", **options)
        else:
            from tierlink.control.etcd_results import EtcdResultStore
            from tierlink.etcd.client import Etcd

            cluster = request.getfixturevalue("etcd_cluster")
            prefix = request.getfixturevalue("etcd_prefix")
            clients.append(Etcd(cluster.endpoints))
            store = EtcdResultStore(clients[-1], prefix=f"{prefix}{len(made)}/", **options)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
    for client in clients:
        client.close()
