from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path

import pytest
from outbox_support import FakeClock, RecordingObserver

from tierlink.errors import ConfigError, OutboxError
from tierlink.outbox import Outbox

NOW = FakeClock().t


def _outbox(tmp_path: Path, clock: FakeClock, **kw: object) -> Outbox:
    return Outbox(tmp_path / "outbox.db", clock=clock, **kw)  # type: ignore[arg-type]


def test_put_stores_a_durable_item_with_a_generated_key(tmp_path: Path) -> None:
    clock = FakeClock()
    box = _outbox(tmp_path, clock, default_ttl_s=60)
    item = box.put("edge-1", "result", b"abc")
    assert re.fullmatch(r"[0-9a-f]{32}", item.key)
    assert (item.created_at, item.expires_at, item.attempts) == (clock.t, clock.t + 60, 0)
    box.close()
    again = Outbox(tmp_path / "outbox.db", clock=clock)  # reopened: still there
    assert again.get(item.key) == item
    assert again.pending() == 1
    mode = sqlite3.connect(tmp_path / "outbox.db").execute("PRAGMA journal_mode").fetchone()
    assert mode == ("wal",)


def test_the_same_key_is_stored_once(tmp_path: Path) -> None:
    box = _outbox(tmp_path, FakeClock())
    first = box.put("edge-1", "result", b"a", key="k1")
    second = box.put("edge-1", "result", b"other bytes", key="k1")
    assert second == first
    assert box.pending() == 1
    with pytest.raises(OutboxError, match="already waiting"):
        box.put("cloud-1", "result", b"a", key="k1")


def test_ids_are_never_reused_after_ack_and_reopen(tmp_path: Path) -> None:
    clock = FakeClock()
    box = _outbox(tmp_path, clock)
    last = box.put("edge-1", "result", b"a")
    box.ack([last.id])
    box.close()
    box = _outbox(tmp_path, clock)
    assert box.put("edge-1", "result", b"b").id > last.id


def test_due_is_the_head_of_each_destination_in_order(tmp_path: Path) -> None:
    clock = FakeClock()
    box = _outbox(tmp_path, clock)
    a = [box.put("edge-1", "result", bytes([i])) for i in range(5)]
    b = box.put("cloud-1", "telemetry", b"x")
    assert [i.id for i in box.due("edge-1", clock.t, 3)] == [i.id for i in a[:3]]
    assert box.due("cloud-1", clock.t, 10) == [b]
    assert box.destinations() == ["cloud-1", "edge-1"]
    assert box.pending("edge-1") == 5


def test_a_failed_head_blocks_its_destination_until_its_retry_time(tmp_path: Path) -> None:
    clock = FakeClock()
    box = _outbox(tmp_path, clock)
    a = [box.put("edge-1", "result", bytes([i])) for i in range(3)]
    other = box.put("cloud-1", "result", b"x")
    box.fail(a[0].id, "refused", clock.t + 5)
    assert box.due("edge-1", clock.t, 10) == []  # nothing overtakes the head
    assert box.due("cloud-1", clock.t, 10) == [other]  # other destinations go on
    assert box.head("edge-1", clock.t) is not None
    clock.advance(5)
    due = box.due("edge-1", clock.t, 10)
    assert [i.id for i in due] == [i.id for i in a]
    assert (due[0].attempts, due[0].last_error) == (1, "refused")


def test_expire_drops_items_past_their_ttl_and_counts_them(tmp_path: Path) -> None:
    clock, seen = FakeClock(), RecordingObserver()
    box = _outbox(tmp_path, clock, observer=seen)
    short = box.put("edge-1", "result", b"a", ttl_s=10)
    long = box.put("edge-1", "result", b"b", ttl_s=100)
    clock.advance(10)
    assert box.due("edge-1", clock.t, 10) == [long]  # an expired item is never sent
    assert box.expire(clock.t) == 1
    assert box.get(short.key) is None
    assert seen.dropped == {"expired": 1}
    assert box.stats().dropped == {"expired": 1}
    assert box.pending() == 1


def test_refuse_policy_raises_and_keeps_what_was_accepted(tmp_path: Path) -> None:
    seen = RecordingObserver()
    box = _outbox(tmp_path, FakeClock(), max_items=2, full_policy="refuse", observer=seen)
    kept = [box.put("edge-1", "result", b"a"), box.put("edge-1", "result", b"b")]
    with pytest.raises(OutboxError, match="refused") as info:
        box.put("edge-1", "result", b"c")
    assert "NOT accepted" in str(info.value)
    assert [i.key for i in box.due("edge-1", NOW, 10)] == [i.key for i in kept]
    assert seen.dropped == {"refused": 1}
    assert box.put("edge-1", "result", b"a", key=kept[0].key) == kept[0]  # re-put: no room needed


def test_drop_oldest_evicts_the_oldest_of_the_same_kind(tmp_path: Path) -> None:
    seen = RecordingObserver()
    box = _outbox(tmp_path, FakeClock(), max_items=3, full_policy="drop_oldest", observer=seen)
    items = [box.put("edge-1", "telemetry", bytes([i])) for i in range(5)]
    waiting = box.due("edge-1", NOW, 10)
    assert [i.key for i in waiting] == [i.key for i in items[2:]]
    assert seen.dropped == {"full": 2}


def test_drop_oldest_makes_room_by_bytes(tmp_path: Path) -> None:
    box = _outbox(tmp_path, FakeClock(), max_bytes=100, full_policy="drop_oldest")
    for _ in range(4):
        box.put("edge-1", "telemetry", b"x" * 30)
    box.put("edge-1", "telemetry", b"y" * 70)  # needs 3 of the 30-byte items gone
    stats = box.stats()
    assert (stats.items, stats.bytes) == (2, 100)
    assert stats.dropped == {"full": 3}
    with pytest.raises(OutboxError, match="larger than max_bytes"):
        box.put("edge-1", "telemetry", b"z" * 101)


def test_per_kind_policies_never_evict_refuse_kinds(tmp_path: Path) -> None:
    box = _outbox(tmp_path, FakeClock(), max_items=3,
                  full_policy={"result": "refuse", "telemetry": "drop_oldest"})
    box.put("edge-1", "telemetry", b"t1")
    box.put("edge-1", "result", b"r1")
    box.put("edge-1", "telemetry", b"t2")
    box.put("edge-1", "result", b"r2")  # evicts t1: telemetry makes room for results
    box.put("edge-1", "result", b"r3")  # evicts t2
    assert box.stats().by_kind.keys() == {"result"}
    with pytest.raises(OutboxError):
        box.put("edge-1", "result", b"r4")  # only results left: refused
    with pytest.raises(OutboxError):
        box.put("edge-1", "telemetry", b"t3")  # cannot evict results either
    assert box.policy("hard_example") == "refuse"  # no "*": unknown kinds are refused


def test_bad_configuration_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="full_policy"):
        Outbox(tmp_path / "o.db", full_policy="drop_newest")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_items"):
        Outbox(tmp_path / "o.db", max_items=0)


def test_stats_by_destination_and_kind(tmp_path: Path) -> None:
    clock = FakeClock()
    box = _outbox(tmp_path, clock)
    box.put("edge-1", "result", b"aa")
    clock.advance(3)
    box.put("edge-1", "telemetry", b"bbb")
    box.put("cloud-1", "result", b"c")
    clock.advance(1)
    stats = box.stats()
    assert (stats.items, stats.bytes, stats.oldest_age_s) == (3, 6, 4.0)
    assert stats.by_destination["edge-1"].items == 2
    assert stats.by_destination["edge-1"].bytes == 5
    assert stats.by_kind["result"].bytes == 3


def test_ack_and_drop_remove_and_count(tmp_path: Path) -> None:
    seen = RecordingObserver()
    box = _outbox(tmp_path, FakeClock(), observer=seen)
    a, b = box.put("edge-1", "result", b"a"), box.put("edge-1", "result", b"b")
    assert box.ack([a.id, a.id + 1000]) == 1
    assert box.drop([b.id], "rejected") == 1
    assert (box.pending(), box.stats().bytes) == (0, 0)
    assert seen.dropped == {"rejected": 1}


def test_concurrent_puts_are_all_stored(tmp_path: Path) -> None:
    box = _outbox(tmp_path, FakeClock())

    def produce(n: int) -> None:
        for i in range(20):
            box.put(f"dest-{n % 2}", "result", f"{n}-{i}".encode())

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert box.pending() == 80
    assert len(box.due("dest-0", NOW, 100)) == 40
