"""The append-only log on a real etcd cluster: numbered once, deduplicated, paged, trimmed,
and shared by writers that append at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tierlink.errors import InvalidRequest
from tierlink.etcd import log as etcd_log
from tierlink.etcd.client import Etcd
from tierlink.etcd.log import EtcdLog

pytestmark = pytest.mark.integration


@pytest.fixture
def client(etcd_cluster) -> Iterator[Etcd]:
    with Etcd(etcd_cluster.endpoints) as etcd:
        yield etcd


def test_entries_are_numbered_in_order_and_a_replay_is_a_duplicate(client, etcd_prefix):
    log = EtcdLog(client, etcd_prefix)
    assert log.append([("a", b"1"), ("b", b"2"), ("a", b"again")]) == [1, 2, None]
    assert log.append([("b", b"2"), ("c\nodd", b"3")]) == [None, 3]
    assert [(e.seq, e.key, e.value) for e in log.after(0, 10)] == \
        [(1, "a", b"1"), (2, "b", b"2"), (3, "c\nodd", b"3")]
    assert [e.seq for e in log.after(1, 1)] == [2]
    assert log.find("b") == log.after(1, 1)[0] and log.find("zz") is None
    assert log.count() == 3


def test_a_remembered_key_has_no_entry_but_is_held(client, etcd_prefix):
    log = EtcdLog(client, etcd_prefix)
    assert log.remember("k") and not log.remember("k")
    assert log.holds("k") and log.find("k") is None and log.count() == 0
    assert log.append([("k", b"x")]) == [None]


def test_trimming_keeps_the_newest_and_numbers_are_never_reused(client, etcd_prefix):
    log = EtcdLog(client, etcd_prefix)
    log.append([(f"k{i}", b"v") for i in range(7)])
    assert [e.seq for e in log.trim(3, forget_keys=True)] == [1, 2, 3, 4]
    assert [e.seq for e in log.after(0, 10)] == [5, 6, 7]
    assert log.append([("k0", b"v")]) == [8]  # its key was forgotten: new again
    assert len(log.trim(2, forget_keys=False)) == 2
    assert log.append([("k5", b"v")]) == [None]  # a kept key: still a duplicate


def test_a_big_batch_spans_transactions(client, etcd_prefix, monkeypatch):
    monkeypatch.setattr(etcd_log, "MAX_BYTES", 1000)
    log = EtcdLog(client, etcd_prefix)
    numbers = log.append([(f"k{i}", bytes(300)) for i in range(200)])
    assert numbers == list(range(1, 201)) and log.count() == 200
    with pytest.raises(InvalidRequest, match="larger than the etcd store takes"):
        log.append([("huge", bytes(2000))])


def test_writers_appending_at_once_take_turns(etcd_cluster, etcd_prefix):
    """Four writers (one client each, like replicas) append 25 entries each, some keys
    shared: every entry gets one number, 1..N without a gap, each key once."""
    got: list[list[int | None]] = []
    errors: list[Exception] = []

    def writer(w: int) -> None:
        with Etcd(etcd_cluster.endpoints) as etcd:
            log = EtcdLog(etcd, etcd_prefix)
            try:
                for i in range(25):
                    got.append(log.append([(f"w{w}-{i}", b"x"), (f"shared-{i}", b"y")]))
            except Exception as exc:  # noqa: BLE001 (surfaced below)
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    numbers = sorted(n for pair in got for n in pair if n is not None)
    assert numbers == list(range(1, 4 * 25 + 25 + 1))
    with Etcd(etcd_cluster.endpoints) as etcd:
        keys = [e.key for e in EtcdLog(etcd, etcd_prefix).after(0, 1000)]
    assert len(keys) == len(set(keys)) == 125
