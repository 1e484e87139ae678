"""The control plane's result store and routes: each key stored once, replays answered
``duplicate``, malformed batches refused whole, paging, and senders that are who they say."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tierlink.control.etcd_results import EtcdResultStore
from tierlink.control.identity import IdentityStore, bearer
from tierlink.control.results import ResultMetrics, ResultStore, install_result_routes
from tierlink.errors import ConfigError
from tierlink.etcd.client import Etcd
from tierlink.outbox import AckStatus, wire

ADMIN = "admin-token-0123456789"


@pytest.fixture
def results(make_results: Callable[..., ResultStore]) -> ResultStore:
    """A result store, on SQLite and on etcd (tests/control/conftest.py)."""
    return make_results()


@pytest.fixture
def client(results: ResultStore) -> Iterator[tuple[TestClient, ResultMetrics]]:
    app = FastAPI()
    metrics = ResultMetrics()
    install_result_routes(app, results, metrics=metrics)
    with TestClient(app) as c:
        yield c, metrics


def item(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "kind": "result", "payload": {"request_id": key.split(":")[-1]},
            "created_at": 1000.0, **extra}


def batch(*items: dict[str, Any], sender: str = "edge-1") -> dict[str, Any]:
    return {"from": sender, "items": list(items)}


def outcomes(metrics: ResultMetrics) -> dict[str, float | None]:
    return {o: metrics.registry.get_sample_value("tierlink_control_results_total",
                                                 {"outcome": o})
            for o in ("stored", "duplicate", "rejected")}


def test_a_replay_is_answered_duplicate_and_stored_once(client: Any) -> None:
    http, metrics = client
    sent = batch(item("dev-1:1", chain=["dev-1"]), item("edge-1:2"))
    first = http.post("/v1/results", json=sent)
    assert first.status_code == 200
    assert [a["status"] for a in first.json()["acks"]] == ["ok", "ok"]
    again = http.post("/v1/results", json=sent)
    assert [a["status"] for a in again.json()["acks"]] == ["duplicate", "duplicate"]
    stored = http.get("/v1/results/dev-1:1").json()
    assert stored["origin"] == "dev-1" and stored["chain"] == ["dev-1", "edge-1"]
    assert (stored["sender"], stored["kind"], stored["created_at"]) == ("edge-1", "result", 1000.0)
    assert stored["payload"] == {"request_id": "1"}
    assert http.get("/v1/results/edge-1:2").json()["chain"] == ["edge-1"]
    assert outcomes(metrics) == {"stored": 2, "duplicate": 2, "rejected": 0}
    assert metrics.registry.get_sample_value("tierlink_control_results_stored") == 2


def test_an_unknown_key_is_a_404_with_a_hint(client: Any) -> None:
    http, _ = client
    answer = http.get("/v1/results/dev-1:nope")
    assert answer.status_code == 404
    body = answer.json()
    assert body["code"] == "result_not_found" and "dev-1:nope" in body["error"]
    assert "retry later" in body["hint"]


def test_a_malformed_batch_is_a_400_and_nothing_is_stored(client: Any,
                                                          results: ResultStore) -> None:
    http, metrics = client
    answer = http.post("/v1/results", json=batch(item("dev-1:1"), {"kind": "result"}))
    assert answer.status_code == 400
    assert "items[1].key" in answer.json()["error"]
    assert results.count() == 0
    assert outcomes(metrics)["rejected"] == 1


def test_an_unreadable_item_is_rejected_alone(client: Any, results: ResultStore) -> None:
    http, metrics = client
    answer = http.post("/v1/results", json=batch(item("a", created_at="yesterday"), item("b")))
    acks = answer.json()["acks"]
    assert [a["status"] for a in acks] == ["rejected", "ok"]
    assert acks[0]["detail"].startswith("items[0].created_at")
    assert results.count() == 1 and outcomes(metrics)["rejected"] == 1


def test_results_page_in_arrival_order(client: Any) -> None:
    http, _ = client
    http.post("/v1/results", json=batch(*[item(f"k{i}") for i in range(5)]))
    first = http.get("/v1/results", params={"limit": 2}).json()
    assert [r["key"] for r in first["results"]] == ["k0", "k1"]
    rest = http.get("/v1/results", params={"after": first["next_after"], "limit": 10}).json()
    assert [r["key"] for r in rest["results"]] == ["k2", "k3", "k4"]
    assert rest["next_after"] is None
    bad = http.get("/v1/results", params={"limit": "lots"})
    assert bad.status_code == 400 and "limit must be an integer 1..1000" in bad.json()["error"]


def test_the_key_and_the_row_commit_together(tmp_path: Path) -> None:
    results = ResultStore(tmp_path / "control.db")
    parsed = wire.parse_batch(json.dumps(batch(item("k1"), item("k1"))).encode())
    acks = results.add(parsed)  # one key twice in a batch: stored once
    results.close()
    assert [a.status for a in acks] == [AckStatus.OK, AckStatus.DUPLICATE]
    db = sqlite3.connect(tmp_path / "control.db")
    keys = db.execute("SELECT idempotency_key FROM inbox_applied").fetchall()
    rows = db.execute("SELECT key FROM async_results").fetchall()
    assert keys == rows == [("k1",)]
    db.close()


def test_on_the_control_app_a_node_posts_only_its_own_batches(tmp_path: Path) -> None:
    from tierlink.control.app import create_app
    from tierlink.control.store import SqliteRegistryStore

    db = tmp_path / "control.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, ADMIN)
    secret = identity.enroll(identity.create_token(0.0), "edge-1", "edge", 1.0)
    app = create_app(registry, identity=identity)  # opens a ResultStore on the same file
    edge = {"authorization": bearer("node", secret, "edge-1")}
    try:
        with TestClient(app) as http:
            assert http.post("/v1/results", json=batch(item("x"))).status_code == 401
            assert http.post("/v1/results", json=batch(item("x"), sender="edge-2"),
                             headers=edge).status_code == 403
            ok = http.post("/v1/results", json=batch(item("x")), headers=edge)
            assert [a["status"] for a in ok.json()["acks"]] == ["ok"]
            assert "tierlink_control_results_total" in http.get("/metrics").text
            assert app.state.results.count() == 1
            assert http.get("/v1/results", headers=edge).status_code == 403  # operators read
            admin = {"authorization": bearer("admin", ADMIN)}
            assert len(http.get("/v1/results", headers=admin).json()["results"]) == 1
    finally:
        identity.close()
        registry.close()


def test_the_store_keeps_the_latest_max_rows_and_counts_evictions(
        make_results: Callable[..., ResultStore]) -> None:
    store = make_results(max_rows=3)
    app, metrics = FastAPI(), ResultMetrics()
    install_result_routes(app, store, metrics=metrics)
    try:
        with TestClient(app) as http:
            http.post("/v1/results", json=batch(item("k1"), item("k2")))
            answer = http.post("/v1/results", json=batch(item("k3"), item("k4"), item("k5")))
            assert [a["status"] for a in answer.json()["acks"]] == ["ok"] * 3
            kept = http.get("/v1/results").json()["results"]
            assert [r["key"] for r in kept] == ["k3", "k4", "k5"]
            assert http.get("/v1/results/k1").status_code == 404
            # An evicted key is still remembered: a late replay is not stored again.
            replay = http.post("/v1/results", json=batch(item("k1")))
            assert [a["status"] for a in replay.json()["acks"]] == ["duplicate"]
        assert metrics.registry.get_sample_value("tierlink_control_results_total",
                                                 {"outcome": "evicted"}) == 2
        assert store.count() == 3
    finally:
        store.close()


def test_stored_items_past_the_retention_are_dropped(tmp_path: Path) -> None:
    now = [1_733_140_000.0]
    store = ResultStore(tmp_path / "control.db", retention_s=3600.0, clock=lambda: now[0])
    try:
        store.add(wire.parse_batch(json.dumps(batch(item("old"))).encode()))
        now[0] += 2 * 3600.0  # past the retention and the prune interval
        store.add(wire.parse_batch(json.dumps(batch(item("new"))).encode()))
        assert [r.key for r in store.page()] == ["new"]
        assert store.take_evicted() == 1 and store.take_evicted() == 0
    finally:
        store.close()


def test_a_result_store_needs_a_positive_cap_and_retention(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_rows >= 1"):
        ResultStore(tmp_path / "a.db", max_rows=0)
    with pytest.raises(ConfigError, match="retention_s > 0"):
        ResultStore(tmp_path / "b.db", retention_s=0)


@pytest.fixture
def etcd(etcd_cluster: Any) -> Iterator[Etcd]:
    with Etcd(etcd_cluster.endpoints) as client:
        yield client


def test_on_etcd_every_replica_reads_what_any_was_delivered(etcd: Etcd,
                                                            etcd_prefix: str) -> None:
    """Two replicas' stores on one etcd prefix: a result delivered to one is read from the
    other, and a replay of it to the other is a duplicate."""
    first = EtcdResultStore(etcd, prefix=etcd_prefix)
    second = EtcdResultStore(etcd, prefix=etcd_prefix)
    sent = wire.parse_batch(json.dumps(batch(item("dev-1:7"), item("dev-1:8"))).encode())
    assert [a.status for a in first.add(sent)] == [AckStatus.OK] * 2
    assert [a.status for a in second.add(sent)] == [AckStatus.DUPLICATE] * 2
    got = second.get("dev-1:7")
    assert got is not None and got.sender == "edge-1" and got.payload == {"request_id": "7"}
    assert [r.key for r in second.page()] == ["dev-1:7", "dev-1:8"]


def test_on_etcd_a_lease_ends_what_is_past_the_retention(etcd: Etcd, etcd_prefix: str) -> None:
    store = EtcdResultStore(etcd, prefix=etcd_prefix, retention_s=1.0)  # a 2 s lease
    store.add(wire.parse_batch(json.dumps(batch(item("soon-gone"))).encode()))
    assert store.get("soon-gone") is not None
    deadline = time.monotonic() + 10.0
    while store.get("soon-gone") is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert store.get("soon-gone") is None and store.count() == 0
