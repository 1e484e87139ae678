"""The registry on a real etcd cluster: leases, watches, replicas sharing one view."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tierlink.control.etcd_store import EtcdRegistryStore
from tierlink.control.schemas import Heartbeat
from tierlink.etcd.client import Etcd

pytestmark = pytest.mark.integration

TTL = 5.0


@pytest.fixture
def replicas(etcd_cluster, etcd_prefix) -> Iterator[Callable[[], EtcdRegistryStore]]:
    """``replica()``: one more control-plane store on the cluster, all sharing the prefix."""
    made: list[tuple[Etcd, EtcdRegistryStore]] = []

    def replica() -> EtcdRegistryStore:
        client = Etcd(etcd_cluster.endpoints)
        store = EtcdRegistryStore(client, prefix=etcd_prefix).start()
        made.append((client, store))
        return store

    yield replica
    for client, store in made:
        store.close()
        client.close()


@pytest.fixture
def hb(make_body) -> Callable[..., Heartbeat]:
    def build(**overrides) -> Heartbeat:
        return Heartbeat.model_validate(make_body(**overrides))
    return build


def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_a_heartbeat_registers_and_another_replica_sees_it(replicas, hb):
    a, b = replicas(), replicas()
    record = a.upsert(hb(), time.time(), TTL)
    assert record.generation == 1
    assert a.get("edge-1", time.time()) is not None  # read-your-write, before the watch
    assert eventually(lambda: b.get("edge-1", time.time()) is not None)
    assert [r.node_id for r in b.alive(time.time(), TTL)] == ["edge-1"]
    assert b.alive_json(time.time(), TTL)[0].startswith('{"registered_at"')


def test_a_heartbeat_with_nothing_new_writes_nothing(replicas, hb, etcd_cluster):
    a = replicas()
    a.upsert(hb(), time.time(), TTL)
    before = a.etcd.status()["header"]["revision"]
    for _ in range(5):
        a.upsert(hb(), time.time(), TTL)
    assert a.etcd.status()["header"]["revision"] == before
    assert a.upsert(hb(queue_depth=3), time.time(), TTL).queue_depth == 3
    assert a.get("edge-1", time.time()).queue_depth == 3  # held here at once...
    # ... and written behind, within the renewer's next round.
    assert eventually(lambda: int(a.etcd.status()["header"]["revision"]) == int(before) + 1)


def test_a_change_reaches_the_other_replica_through_the_watch(replicas, hb):
    a, b = replicas(), replicas()
    a.upsert(hb(queue_depth=1), time.time(), TTL)
    seen = b.revision
    a.upsert(hb(queue_depth=9), time.time(), TTL)
    assert b.wait_for_change(seen, timeout_s=5.0) > seen
    assert eventually(lambda: (b.get("edge-1", time.time()) or hb()).queue_depth == 9)


def test_the_lease_expires_a_silent_node(replicas, hb):
    a, b = replicas(), replicas()
    a.upsert(hb(), time.time(), 1.0)  # a lease of 2 s (1 s + a third, rounded up)
    assert eventually(lambda: b.get("edge-1", time.time()) is not None)
    assert eventually(lambda: b.get("edge-1", time.time()) is None, timeout_s=6.0)
    assert eventually(lambda: a.get("edge-1", time.time()) is None, timeout_s=2.0)
    assert a.expire(time.time(), 1.0) == ["edge-1"]
    # It comes back with a higher generation, at either replica.
    assert b.upsert(hb(), time.time(), 1.0).generation == 2


def test_a_restart_starts_a_new_generation(replicas, hb):
    a, b = replicas(), replicas()
    a.upsert(hb(started_at=100.0), time.time(), TTL)
    assert eventually(lambda: b.get("edge-1", time.time()) is not None)
    record = b.upsert(hb(started_at=200.0), time.time(), TTL)
    assert record.generation == 2
    assert eventually(lambda: (a.get("edge-1", time.time()) or hb()).started_at == 200.0)


def test_a_node_moves_to_another_replica_and_keeps_its_generation_and_lease(replicas, hb):
    a, b = replicas(), replicas()
    a.upsert(hb(), time.time(), 1.0)
    assert eventually(lambda: b.get("edge-1", time.time()) is not None)
    for _ in range(12):  # 3 s of heartbeats to b only: b renews the lease a granted
        record = b.upsert(hb(), time.time(), 1.0)
        time.sleep(0.25)
    assert record.generation == 1
    assert a.get("edge-1", time.time()) is not None


def test_remove_deregisters_everywhere(replicas, hb):
    a, b = replicas(), replicas()
    a.upsert(hb(), time.time(), TTL)
    assert eventually(lambda: b.get("edge-1", time.time()) is not None)
    assert b.remove("edge-1") is True
    assert eventually(lambda: a.get("edge-1", time.time()) is None)
    assert a.expire(time.time(), TTL) == []  # a deregistration is not an expiry
    assert b.remove("edge-1") is False


def test_split_profiles_are_shared_by_digest(replicas, hb, make_body):
    a, b = replicas(), replicas()
    body = make_body()
    body["models"][0]["splits"] = [{"cut": "c1", "head_ms": 1.0, "tail_ms": 2.0,
                                    "feature_bytes": 3}]
    a.upsert(Heartbeat.model_validate(body), time.time(), TTL)
    assert eventually(lambda: bool(b.alive_json(time.time(), TTL, digests=True)))
    lite = b.alive_json(time.time(), TTL, digests=True)[0]
    digest = lite.split('"splits_digest":"')[1].split('"')[0]
    assert b.split_profile(digest) is not None


def test_a_new_replica_starts_from_the_stored_view(replicas, hb):
    a = replicas()
    a.upsert(hb(node_id="edge-1"), time.time(), TTL)
    a.upsert(hb(node_id="edge-2"), time.time(), TTL)
    late = replicas()
    assert [r.node_id for r in late.alive(time.time(), TTL)] == ["edge-1", "edge-2"]


def test_a_drain_at_one_replica_shows_at_the_other(replicas, hb):
    a, b = replicas(), replicas()
    a.upsert(hb(), time.time(), TTL)
    assert a.drain("edge-1", True) is True
    assert a.get("edge-1", time.time()).draining is True
    assert eventually(lambda: (b.get("edge-1", time.time()) or hb()).draining is True)
    assert '"draining": true' in b.alive_json(time.time(), TTL)[0]
    assert b.drain("edge-1", False) is True
    assert eventually(lambda: not a.get("edge-1", time.time()).draining)


def test_a_quiet_node_moving_replica_keeps_its_generation(replicas, hb):
    a, b = replicas(), replicas()
    for _ in range(8):  # 2 s of unchanged heartbeats at a (ttl 1 s): renewals, few writes
        record = a.upsert(hb(), time.time(), 1.0)
        time.sleep(0.25)
    assert record.generation == 1
    assert eventually(lambda: b.get("edge-1", time.time()) is not None)
    assert b.upsert(hb(), time.time(), 1.0).generation == 1
    got = b.get("edge-1", time.time())
    assert got is not None and got.age_s < 1.0


def test_quiet_nodes_cost_one_batched_renewal_and_one_transaction(replicas, hb):
    a = replicas()
    t0 = time.time()
    for i in range(50):
        a.upsert(hb(node_id=f"dev-{i:02d}"), t0, 30.0)  # leases of 40 s: none runs out here
    for i in range(50):  # 16 s later (a fake clock ahead of time): renewal and a rewrite due
        assert a.repeat(f"dev-{i:02d}", t0 + 16.0, 30.0) is not None
    assert a.repeat("dev-99", t0 + 16.0, 30.0) is None  # unknown: the whole path
    # The renewer's next round(s): the leases in one call, the 50 last_seen in one
    # transaction (two when a round began while the 50 were being heard).
    def written() -> set[int]:
        kvs, _ = a.etcd.prefix(a.prefix + "nodes/")
        assert len(kvs) == 50
        return {kv.mod_revision for kv in kvs}

    assert eventually(lambda: len(written()) <= 2)
    # etcd holds the transaction a moment before the replica's view records it: wait for both
    assert eventually(lambda: all(a._entries[f"dev-{i:02d}"].last_seen == t0 + 16.0
                                  for i in range(50)))
