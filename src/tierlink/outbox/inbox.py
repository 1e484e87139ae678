"""The receiver side of store-and-forward: apply each idempotency key once, answer repeats
with the original answer.

The sender's outbox delivers *at least once*: an item whose ack was lost (the receiver
applied it, then the connection or the sender died) is sent again with the same key. The
:class:`Inbox` turns that into *exactly once* by remembering, per key, that it was applied
and what was answered:

* **Effect is a write to the receiver's SQLite database** (the strong case): open one
  transaction on a connection to the *same* database file as the inbox, call
  :meth:`Inbox.record` first, and write the effect only when it returns True. The key and the
  effect commit or roll back together, so a crash anywhere leaves either both or neither.
* **Any other effect** (:meth:`Inbox.apply`): the effect runs, then the key is recorded with
  its result (fsynced). Concurrent deliveries of one key are serialised, and every repeat
  gets the stored result without running the effect. A crash *between* the effect and the
  record leaves the key unrecorded, so the redelivery applies it again: make such effects
  idempotent themselves, or use :meth:`record`.

Bounded retention: keys older than ``retention_s`` (default 7 days) are pruned. A redelivery
of a key older than that would be applied again, so the window must be much longer than any
sender's outbox TTL (the outbox default is one day; an item is never sent after its TTL).

Durability: WAL with ``synchronous=FULL`` on the inbox's own connection, so a recorded key
survives kill -9 and power loss before the answer is sent. Callers of :meth:`record` own their
connection and should commit with ``synchronous=FULL`` for the same guarantee.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from tierlink.errors import ConfigError, OutboxError
from tierlink.sqlite_store import mapped_errors

DEFAULT_RETENTION_S = 7 * 86_400.0
_STRIPES = 64  # per-key locks, striped: bounded memory, rare false sharing

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS inbox_applied (
    idempotency_key TEXT PRIMARY KEY,
    result          BLOB NOT NULL,   -- the answer given when it was applied
    applied_at      REAL NOT NULL    -- epoch s, for retention
)
""",
    "CREATE INDEX IF NOT EXISTS inbox_applied_by_time ON inbox_applied (applied_at)",
)


class Inbox:
    """Dedupes delivered items by idempotency key (see module doc). Thread-safe.

    ``clock`` (epoch seconds) stamps recorded keys and drives retention; ``prune_every_s``
    bounds how often :meth:`apply` prunes on its own (receivers that only use
    :meth:`record` call :meth:`prune` from a periodic task).
    """

    def __init__(self, path: str | Path, *, retention_s: float = DEFAULT_RETENTION_S,
                 clock: Callable[[], float] = time.time, prune_every_s: float = 60.0) -> None:
        if not retention_s > 0:
            raise ConfigError(f"inbox retention_s must be > 0, got {retention_s}")
        self.path = str(path)
        self.retention_s = float(retention_s)
        self._clock = clock
        self._prune_every_s = prune_every_s
        self._last_prune = float("-inf")
        self._lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._conn = _connect(self.path)

    def apply(self, key: str, effect: Callable[[], bytes]) -> tuple[bytes, bool]:
        """Run ``effect`` once per ``key``: returns ``(result, duplicate)``. A repeat returns
        the stored result with ``duplicate=True`` and does not run ``effect``. If ``effect``
        raises, nothing is recorded and the exception propagates (a redelivery retries)."""
        with self._stripes[hash(key) % _STRIPES]:
            stored = self.result(key)
            if stored is not None:
                return stored, True
            result = bytes(effect())
            with self._lock, self._guard("record an applied key"):
                self._conn.execute("PRAGMA synchronous=FULL")
                with self._conn:
                    self._conn.execute(
                        "INSERT INTO inbox_applied (idempotency_key, result, applied_at) "
                        "VALUES (?, ?, ?)", (key, sqlite3.Binary(result), self._clock()))
        self._maybe_prune()
        return result, False

    def record(self, key: str, conn: sqlite3.Connection, result: bytes = b"") -> bool:
        """Record ``key`` inside the caller's open transaction on ``conn`` (a connection to
        this inbox's database file). True: new, write the effect in the same transaction.
        False: a duplicate, skip the effect and answer :meth:`result`. Make it the first
        statement of a transaction (``BEGIN IMMEDIATE``, or the implicit one of ``with
        conn:``), so a concurrent delivery of the key waits for this one's commit."""
        self._check_same_file(conn)
        with _errors(self.path, "record an applied key"):
            cur = conn.execute(
                "INSERT OR IGNORE INTO inbox_applied (idempotency_key, result, applied_at) "
                "VALUES (?, ?, ?)", (key, sqlite3.Binary(bytes(result)), self._clock()))
        return cur.rowcount == 1

    def result(self, key: str) -> bytes | None:
        """The answer stored for ``key``; None when it was not applied (or was pruned)."""
        with self._lock, self._guard("read an applied key"):
            row = self._conn.execute(
                "SELECT result FROM inbox_applied WHERE idempotency_key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def seen(self, key: str) -> bool:
        return self.result(key) is not None

    def prune(self, now: float | None = None) -> int:
        """Forget keys applied more than ``retention_s`` ago. Returns how many."""
        now = self._clock() if now is None else now
        with self._lock, self._guard("prune applied keys"):
            self._conn.execute("PRAGMA synchronous=NORMAL")  # losing a prune loses nothing
            with self._conn:
                cur = self._conn.execute("DELETE FROM inbox_applied WHERE applied_at < ?",
                                         (now - self.retention_s,))
            self._last_prune = now
        return max(0, cur.rowcount)

    def count(self) -> int:
        """Keys remembered."""
        with self._lock, self._guard("count applied keys"):
            (n,) = self._conn.execute("SELECT COUNT(*) FROM inbox_applied").fetchone()
        return int(n)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _maybe_prune(self) -> None:
        now = self._clock()
        if now - self._last_prune >= self._prune_every_s:
            self.prune(now)

    def _check_same_file(self, conn: sqlite3.Connection) -> None:
        rows = conn.execute("PRAGMA database_list").fetchall()
        files = {os.path.realpath(str(f)) for (_seq, name, f) in rows if name == "main" and f}
        if os.path.realpath(self.path) not in files:
            raise ConfigError(
                f"Inbox.record needs a connection to the inbox's database {self.path}, "
                f"got one to {sorted(files) or 'an in-memory database'}",
                hint="keep the inbox table in the receiver's own database file, so the key "
                     "and the effect commit in one transaction")

    def _guard(self, action: str) -> AbstractContextManager[None]:
        return _errors(self.path, action)


def _errors(path: str, action: str) -> AbstractContextManager[None]:
    return mapped_errors(lambda message: OutboxError(
        message, hint="is the receiver's disk full or failing?"), f"inbox {path}: could not {action}")


def _connect(path: str) -> sqlite3.Connection:
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, check_same_thread=False)  # serialised by the lock
    except (OSError, sqlite3.Error) as exc:
        raise OutboxError(f"cannot open inbox {path}: {exc}",
                          hint="check that the receiver's state directory is writable") from exc
    try:
        with _errors(path, "prepare the inbox"):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=5000")
            with conn:
                for statement in _SCHEMA:
                    conn.execute(statement)
    except BaseException:
        conn.close()
        raise
    return conn
