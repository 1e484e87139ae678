from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from tierlink.control.schemas import Heartbeat
from tierlink.control.store import SqliteRegistryStore
from tierlink.errors import ControlPlaneError

TTL = 5.0


@pytest.fixture
def hb(make_body):
    def build(**overrides) -> Heartbeat:
        return Heartbeat.model_validate(make_body(**overrides))
    return build


def test_first_heartbeat_registers_generation_one(store, hb, clock):
    record = store.upsert(hb(), clock())
    assert (record.generation, record.registered_at, record.last_seen, record.age_s) == (
        1, clock.now, clock.now, 0.0)
    assert store.get("edge-1", clock()) == record


def test_heartbeats_replace_the_state_and_keep_the_generation(store, hb, clock):
    first = store.upsert(hb(queue_depth=0), clock())
    clock.advance(1.0)
    second = store.upsert(hb(queue_depth=7), clock(), TTL)
    assert second.generation == 1 and second.registered_at == first.registered_at
    assert second.last_seen == clock.now
    clock.advance(0.5)
    got = store.get("edge-1", clock())
    assert got is not None and got.queue_depth == 7 and got.age_s == pytest.approx(0.5)


def test_alive_filters_by_ttl(store, hb, clock):
    store.upsert(hb(node_id="edge-1"), clock())
    clock.advance(2.0)
    store.upsert(hb(node_id="edge-2"), clock())
    clock.advance(TTL - 2.0)  # edge-1 exactly ttl old: still alive
    assert [r.node_id for r in store.alive(clock(), TTL)] == ["edge-1", "edge-2"]
    clock.advance(0.001)
    assert [r.node_id for r in store.alive(clock(), TTL)] == ["edge-2"]


def test_expire_marks_silent_nodes_once(store, hb, clock):
    store.upsert(hb(node_id="b"), clock())
    store.upsert(hb(node_id="a"), clock())
    clock.advance(3.0)
    store.upsert(hb(node_id="c"), clock())
    clock.advance(2.5)
    assert store.expire(clock(), TTL) == ["a", "b"]
    assert store.expire(clock(), TTL) == []
    assert store.get("a", clock()) is None
    assert store.get("c", clock()) is not None


def test_reregistering_after_expiry_starts_a_new_generation(store, hb, clock):
    store.upsert(hb(), clock())
    clock.advance(TTL + 1)
    store.expire(clock(), TTL)
    record = store.upsert(hb(), clock(), TTL)
    assert record.generation == 2 and record.registered_at == clock.now


def test_silence_beyond_ttl_counts_as_expiry_even_before_a_sweep(store, hb, clock):
    store.upsert(hb(), clock())
    clock.advance(TTL + 1)
    assert store.upsert(hb(), clock(), TTL).generation == 2
    clock.advance(TTL + 1)
    # Without a ttl the store cannot tell: same incarnation.
    assert store.upsert(hb(), clock()).generation == 2


def test_restart_with_new_started_at_starts_a_new_generation(store, hb, clock):
    store.upsert(hb(started_at=100.0), clock())
    clock.advance(1.0)
    record = store.upsert(hb(started_at=200.0), clock(), TTL)
    assert record.generation == 2 and record.registered_at == clock.now
    clock.advance(1.0)
    assert store.upsert(hb(started_at=200.0), clock(), TTL).generation == 2


def test_remove_deregisters_and_a_return_is_a_new_generation(store, hb, clock):
    store.upsert(hb(), clock())
    assert store.remove("edge-1") is True
    assert store.remove("edge-1") is False
    assert store.remove("never-seen") is False
    assert store.get("edge-1", clock()) is None and store.alive(clock(), TTL) == []
    assert store.upsert(hb(), clock(), TTL).generation == 2


def test_old_tombstones_are_forgotten(hb, clock):
    store = SqliteRegistryStore(":memory:", tombstone_retention_s=60.0)
    try:
        store.upsert(hb(), clock())
        clock.advance(TTL + 1)
        assert store.expire(clock(), TTL) == ["edge-1"]
        clock.advance(60.0)
        store.expire(clock(), TTL)
        assert store.upsert(hb(), clock(), TTL).generation == 1
    finally:
        store.close()


def test_a_clock_stepping_back_gives_age_zero(store, hb, clock):
    store.upsert(hb(), clock())
    record = store.get("edge-1", clock.now - 10)
    assert record is not None and record.age_s == 0.0


def test_extras_are_stored_and_returned(store, hb, clock):
    store.upsert(hb(zone="eu-1"), clock())
    assert store.alive(clock(), TTL)[0].extra == {"zone": "eu-1"}


def test_state_persists_across_reopen(tmp_path: Path, hb, clock):
    path = tmp_path / "registry.db"
    first = SqliteRegistryStore(path)
    first.upsert(hb(queue_depth=3), clock())
    first.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    clock.advance(1.0)
    again = SqliteRegistryStore(path)
    try:
        [record] = again.alive(clock(), TTL)
        assert record.queue_depth == 3 and record.generation == 1
        assert record.age_s == pytest.approx(1.0)
        clock.advance(TTL + 1)
        assert again.upsert(hb(), clock(), TTL).generation == 2  # the count carried over
    finally:
        again.close()


def test_an_unopenable_path_is_a_control_plane_error(tmp_path: Path):
    path = tmp_path / "missing-dir" / "registry.db"
    with pytest.raises(ControlPlaneError, match="missing-dir") as info:
        SqliteRegistryStore(path)
    assert "directory" in info.value.hint


def test_a_newer_schema_is_refused(tmp_path: Path):
    path = tmp_path / "future.db"
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA user_version = 99")
    with pytest.raises(ControlPlaneError, match="schema version 99"):
        SqliteRegistryStore(path)


def test_concurrent_use_from_threads(tmp_path: Path, hb, clock):
    store = SqliteRegistryStore(tmp_path / "threads.db")
    errors: list[BaseException] = []

    def beat(node: str) -> None:
        try:
            for i in range(50):
                store.upsert(hb(node_id=node, queue_depth=i), clock(), TTL)
                store.alive(clock(), TTL)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=beat, args=(f"n{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    try:
        assert errors == []
        records = store.alive(clock(), TTL)
        assert [(r.node_id, r.queue_depth, r.generation) for r in records] == [
            (f"n{i}", 49, 1) for i in range(4)]
    finally:
        store.close()


def test_reads_decode_each_stored_heartbeat_once(tmp_path: Path, hb, clock, monkeypatch):
    path = tmp_path / "r.db"
    writer = SqliteRegistryStore(path)
    written = [writer.upsert(hb(node_id=n, queue_depth=3), clock()) for n in ("a", "b")]
    writer.close()
    decoded: list[str] = []
    real = Heartbeat.model_validate_json

    def counting(text, *args, **kwargs):
        decoded.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(Heartbeat, "model_validate_json", counting)
    reader = SqliteRegistryStore(path)  # a restarted control plane: decodes what it reads
    try:
        for _ in range(5):
            assert reader.alive(clock(), TTL) == written
        assert len(decoded) == 2  # once per stored heartbeat, not per read
        reader.upsert(hb(node_id="a", queue_depth=9), clock())  # known, validated: no decode
        assert [r.queue_depth for r in reader.alive(clock(), TTL)] == [9, 3]
        assert len(decoded) == 2
    finally:
        reader.close()


def test_the_listed_json_is_the_records(store, hb, clock):
    import json

    store.upsert(hb(node_id="a", queue_depth=2), clock())
    clock.advance(1.5)
    store.upsert(hb(node_id="b"), clock())
    clock.advance(0.25)
    texts = store.alive_json(clock(), TTL)
    records = store.alive(clock(), TTL)
    assert [json.loads(t) for t in texts] == [r.model_dump(mode="json") for r in records]
    assert json.loads(texts[0])["age_s"] == pytest.approx(1.75)


def test_a_drain_shows_in_records_and_outlives_a_restart(tmp_path, hb, clock):
    path = tmp_path / "r.db"
    store = SqliteRegistryStore(path)
    store.upsert(hb(), clock())
    assert store.drain("edge-1", True) is True and store.drain("edge-1", True) is False
    assert store.get("edge-1", clock()).draining is True
    assert '"draining": true' in store.alive_json(clock(), TTL)[0]
    store.close()
    again = SqliteRegistryStore(path)
    assert again.upsert(hb(started_at=9.0), clock()).draining is True  # a restart stays drained
    assert again.drain("edge-1", False) is True
    assert again.get("edge-1", clock()).draining is False
    again.close()
