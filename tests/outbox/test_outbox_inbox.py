from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from outbox_support import FakeClock

from tierlink.errors import ConfigError
from tierlink.outbox import Inbox


def test_apply_runs_the_effect_once_and_repeats_the_answer(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.db", clock=FakeClock())
    effects: list[str] = []

    def effect() -> bytes:
        effects.append("k")
        return b"answer-1"

    assert inbox.apply("k", effect) == (b"answer-1", False)
    assert inbox.apply("k", effect) == (b"answer-1", True)
    inbox.close()
    again = Inbox(tmp_path / "inbox.db")  # survives a restart
    assert again.apply("k", effect) == (b"answer-1", True)
    assert effects == ["k"]


def test_a_failed_effect_is_not_recorded(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.db", clock=FakeClock())

    def broken() -> bytes:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        inbox.apply("k", broken)
    assert not inbox.seen("k")
    assert inbox.apply("k", lambda: b"ok") == (b"ok", False)


def test_concurrent_deliveries_of_one_key_apply_it_once(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.db", clock=FakeClock())
    effects: list[int] = []
    start = threading.Barrier(4)

    def deliver() -> None:
        start.wait()
        inbox.apply("k", lambda: effects.append(1) or b"ok")  # type: ignore[func-returns-value]

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert effects == [1]


def _receiver_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE IF NOT EXISTS results (key TEXT, value TEXT)")
    conn.commit()
    return conn


def test_record_commits_the_key_with_the_effect(tmp_path: Path) -> None:
    path = tmp_path / "receiver.db"
    inbox = Inbox(path, clock=FakeClock())
    conn = _receiver_db(path)

    def receive(key: str, value: str) -> bool:
        with conn:
            if not inbox.record(key, conn, result=b"stored"):
                return False
            conn.execute("INSERT INTO results VALUES (?, ?)", (key, value))
        return True

    assert receive("k1", "v") is True
    assert receive("k1", "v") is False
    assert inbox.result("k1") == b"stored"
    assert conn.execute("SELECT COUNT(*) FROM results").fetchone() == (1,)


def test_record_rolls_back_with_the_effect(tmp_path: Path) -> None:
    path = tmp_path / "receiver.db"
    inbox = Inbox(path, clock=FakeClock())
    conn = _receiver_db(path)
    with pytest.raises(RuntimeError), conn:
        assert inbox.record("k1", conn)
        conn.execute("INSERT INTO results VALUES ('k1', 'v')")
        raise RuntimeError("crash before commit")
    assert not inbox.seen("k1")  # the redelivery will apply it
    assert conn.execute("SELECT COUNT(*) FROM results").fetchone() == (0,)


def test_record_needs_the_inbox_database(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "receiver.db")
    other = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(ConfigError, match="same|inbox's database"):
        inbox.record("k", other)


def test_keys_older_than_the_retention_are_pruned(tmp_path: Path) -> None:
    clock = FakeClock()
    inbox = Inbox(tmp_path / "inbox.db", retention_s=100, clock=clock, prune_every_s=10)
    inbox.apply("old", lambda: b"1")
    clock.advance(60)
    inbox.apply("new", lambda: b"2")
    clock.advance(50)
    assert inbox.prune() == 1
    assert (inbox.seen("old"), inbox.seen("new"), inbox.count()) == (False, True, 1)
    # Documented limit: a redelivery older than the retention is applied again.
    assert inbox.apply("old", lambda: b"1") == (b"1", False)


def test_apply_prunes_on_its_own(tmp_path: Path) -> None:
    clock = FakeClock()
    inbox = Inbox(tmp_path / "inbox.db", retention_s=100, clock=clock, prune_every_s=10)
    inbox.apply("a", lambda: b"")
    clock.advance(150)
    inbox.apply("b", lambda: b"")
    assert inbox.count() == 1
