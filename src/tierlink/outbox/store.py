"""The durable outbox: what a node must deliver upstream, kept on its disk until acknowledged.

Items (results of asynchronous requests, hard examples, telemetry batches) live in one SQLite
table, one row per item, delivered per destination strictly in ``id`` order (``id`` is
AUTOINCREMENT: never reused, so it is the enqueue order even across restarts). An item leaves
the table only when the receiver acknowledged it (:meth:`Outbox.ack`), rejected it for good
(:meth:`Outbox.drop`), its TTL passed (:meth:`Outbox.expire`) or the full policy evicted it.

Durability (WAL journal):

* :meth:`Outbox.put` commits with ``synchronous=FULL``: the WAL is fsynced before ``put``
  returns, so an accepted item survives kill -9 of the process and, on a disk that honours
  fsync, a power loss or OS crash.
* Acks, failures, drops and expiry commit with ``synchronous=NORMAL``: they survive kill -9
  (the WAL is in the OS page cache) but a power loss may undo the last few. Undone acks only
  cause a redelivery, which the receiver's :class:`~tierlink.outbox.inbox.Inbox` answers as
  a duplicate; an undone drop or expiry brings the item back until it is dropped again.
  (WAL frames are written in order, so the fsync of a later ``put`` makes them durable too.)

Idempotent enqueue: every item has an idempotency key (a uuid4 hex when the caller gives
none). Putting a key that is still in the outbox stores nothing and returns the existing item;
a key that was already delivered and acked is stored again, and the receiver's inbox dedupes
it. The key travels with the item, so the receiver sees the same key on every redelivery.

Bounded size (``max_items``, ``max_bytes`` of payload) with an explicit policy per *kind*:

* ``"refuse"`` (the default): the item's kind is never evicted. A ``put`` that does not fit
  after evicting what may be evicted raises :class:`~tierlink.errors.OutboxError`; the item
  was **not** accepted and the caller must keep it or give up on it knowingly.
* ``"drop_oldest"``: the kind is expendable (telemetry-like). To make room, the oldest items
  of the *same* kind are evicted first, then the oldest items of other ``drop_oldest`` kinds;
  each eviction is counted (observer reason ``full``). Items of ``refuse`` kinds are never
  evicted, so expendable data cannot push out results.

A ``full_policy`` mapping gives a policy per kind; its ``"*"`` entry is the default for the
other kinds (``"refuse"`` when absent). An item larger than ``max_bytes`` is always refused.

Thread-safe (one connection behind a lock). Time is read only through the injected ``clock``
(epoch seconds: timestamps are persisted, so it must be wall time, not a monotonic clock);
``due`` and ``expire`` take ``now`` from the caller. One process owns a file at a time: the
size totals are kept in memory, loaded when the file is opened.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from tierlink.errors import ConfigError, OutboxError
from tierlink.outbox.observer import NullObserver, OutboxObserver
from tierlink.sqlite_store import mapped_errors, write_transaction

FullPolicy = Literal["drop_oldest", "refuse"]
FULL_POLICIES: tuple[FullPolicy, ...] = ("drop_oldest", "refuse")
DEFAULT_TTL_S = 86_400.0  # one day; the receiver's inbox keeps keys much longer (7 days)
SCHEMA_VERSION = 1
_CHUNK = 500  # ids per DELETE ... IN (...)

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS items (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,  -- enqueue order, never reused
    destination     TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    kind            TEXT NOT NULL,
    payload         BLOB NOT NULL,
    created_at      REAL NOT NULL,
    expires_at      REAL NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error      TEXT
)
""",
    "CREATE INDEX IF NOT EXISTS items_by_destination ON items (destination, id)",
    "CREATE INDEX IF NOT EXISTS items_by_kind ON items (kind, id)",
    "CREATE INDEX IF NOT EXISTS items_by_expiry ON items (expires_at)",
)
_COLUMNS = ("id, destination, idempotency_key, kind, payload, created_at, expires_at, "
            "attempts, next_attempt_at, last_error")


@dataclass(frozen=True, slots=True)
class Item:
    """One item waiting for delivery (a row of the outbox)."""

    id: int  # enqueue order
    destination: str
    key: str  # idempotency key: the receiver dedupes on it
    kind: str  # e.g. "result", "hard_example", "telemetry"
    payload: bytes
    created_at: float  # epoch s
    expires_at: float  # epoch s; never delivered at or after this time
    attempts: int  # failed sends so far
    next_attempt_at: float  # epoch s; not sent before (backoff after a failure)
    last_error: str | None


@dataclass(frozen=True, slots=True)
class Counts:
    items: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """What waits, for metrics and status pages."""

    items: int
    bytes: int  # payload bytes
    by_destination: dict[str, Counts]
    by_kind: dict[str, Counts]
    oldest_age_s: float | None  # age of the oldest waiting item; None when empty
    dropped: dict[str, int] = field(default_factory=dict)  # since open, by reason


class Outbox:
    """A durable, bounded, per-destination ordered outbox on SQLite (see module doc).

    ``put`` is called by whatever produces items (it fsyncs: about a millisecond on an SSD,
    more on an SD card; call it off the event loop where that matters); ``due``, ``ack``,
    ``fail``, ``drop`` and ``expire`` by the :class:`~tierlink.outbox.delivery.Deliverer`.
    """

    def __init__(self, path: str | Path, *, max_items: int = 100_000,
                 max_bytes: int = 256 * 2**20,
                 full_policy: FullPolicy | Mapping[str, FullPolicy] = "refuse",
                 clock: Callable[[], float] = time.time,
                 default_ttl_s: float = DEFAULT_TTL_S,
                 observer: OutboxObserver | None = None) -> None:
        self.path = str(path)
        self.max_items, self.max_bytes = _positive_int("max_items", max_items), \
            _positive_int("max_bytes", max_bytes)
        self._policies = _policies(full_policy)
        if not default_ttl_s > 0:
            raise ConfigError(f"outbox default_ttl_s must be > 0, got {default_ttl_s}")
        self.default_ttl_s = float(default_ttl_s)
        self._clock = clock
        self._observer: OutboxObserver = observer or NullObserver()
        self._lock = threading.Lock()
        self._conn = _connect(self.path)
        self._count, self._bytes = self._totals()
        self._dropped: dict[str, int] = {}

    # ---- producer side -------------------------------------------------------------------

    def policy(self, kind: str) -> FullPolicy:
        """The full policy of ``kind``."""
        return self._policies.get(kind, self._policies.get("*", "refuse"))

    def put(self, destination: str, kind: str, payload: bytes, key: str | None = None, *,
            ttl_s: float | None = None) -> Item:
        """Accept an item for ``destination``; durable (fsynced) when this returns.

        Returns the stored item, or the existing one when ``key`` is already waiting (then
        nothing is stored). Raises :class:`OutboxError` when the outbox is full and the item
        does not fit under its kind's policy (it was **not** accepted), when ``key`` is
        waiting for another destination or kind, or when the disk fails.
        """
        _check_item(destination, kind, payload, ttl_s)
        key = key or uuid.uuid4().hex
        ttl = self.default_ttl_s if ttl_s is None else float(ttl_s)
        with self._lock, self._guard("accept an item"):
            existing = self._by_key(key)
            if existing is not None:
                return _same_item(existing, destination, kind)
            now = self._clock()
            with self._transaction(sync="FULL"):
                evicted = self._make_room(destination, kind, len(payload))
                item_id = self._insert(destination, kind, payload, key, now, now + ttl)
            self._count += 1
            self._bytes += len(payload)
            self._report("full", evicted)
            return Item(item_id, destination, key, kind, bytes(payload), now, now + ttl, 0,
                        now, None)

    # ---- delivery side -------------------------------------------------------------------

    def due(self, destination: str, now: float, limit: int) -> list[Item]:
        """The head of ``destination``'s line: up to ``limit`` unexpired items in id order,
        stopping before the first one whose retry time has not come (in practice only the
        head has one: it is the only item that is ever failed). Empty when the head waits."""
        with self._lock, self._guard("read due items"):
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM items WHERE destination = ? AND expires_at > ? "
                "ORDER BY id LIMIT ?", (destination, now, max(0, limit))).fetchall()
        items = []
        for row in rows:
            item = _item(row)
            if item.next_attempt_at > now:
                break
            items.append(item)
        return items

    def head(self, destination: str, now: float) -> Item | None:
        """The first unexpired item of ``destination`` (due or waiting for its retry)."""
        with self._lock, self._guard("read the head item"):
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM items WHERE destination = ? AND expires_at > ? "
                "ORDER BY id LIMIT 1", (destination, now)).fetchone()
        return None if row is None else _item(row)

    def ack(self, ids: Sequence[int]) -> int:
        """Remove delivered items (acknowledged by the receiver). Returns how many were here."""
        return self._delete_ids(ids, "acknowledge items", reason=None)

    def drop(self, ids: Sequence[int], reason: str = "rejected") -> int:
        """Remove undeliverable items (e.g. the receiver rejected them for good), counted
        under ``reason``. Returns how many were here."""
        return self._delete_ids(ids, "drop items", reason=reason)

    def fail(self, item_id: int, error: str, next_attempt_at: float) -> None:
        """Record a failed send of ``item_id``: one more attempt, not retried before
        ``next_attempt_at``. Later items of its destination wait behind it."""
        with self._lock, self._guard("record a failed send"), self._transaction("NORMAL"):
            self._conn.execute(
                "UPDATE items SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? "
                "WHERE id = ?", (error[:1000], next_attempt_at, item_id))

    def expire(self, now: float) -> int:
        """Drop every item whose TTL has passed (counted as ``expired``). Returns how many."""
        with self._lock, self._guard("expire items"):
            with self._transaction("NORMAL"):
                sizes = [n for (n,) in self._conn.execute(
                    "DELETE FROM items WHERE expires_at <= ? RETURNING length(payload)",
                    (now,)).fetchall()]
            self._forget(sizes)
            self._report("expired", len(sizes))
            return len(sizes)

    # ---- inspection ----------------------------------------------------------------------

    def pending(self, destination: str | None = None) -> int:
        """Items waiting (expired ones included until :meth:`expire` runs)."""
        if destination is None:
            with self._lock:
                return self._count
        with self._lock, self._guard("count items"):
            (n,) = self._conn.execute("SELECT COUNT(*) FROM items WHERE destination = ?",
                                      (destination,)).fetchone()
        return int(n)

    def destinations(self) -> list[str]:
        """Destinations with items waiting."""
        with self._lock, self._guard("list destinations"):
            rows = self._conn.execute("SELECT DISTINCT destination FROM items").fetchall()
        return sorted(str(d) for (d,) in rows)

    def get(self, key: str) -> Item | None:
        """The waiting item with idempotency key ``key``, if any."""
        with self._lock, self._guard("read an item"):
            return self._by_key(key)

    def stats(self) -> OutboxStats:
        """Counts and payload bytes by destination and by kind, age of the oldest item,
        and the drops since this outbox was opened."""
        with self._lock, self._guard("read statistics"):
            rows = self._conn.execute(
                "SELECT destination, kind, COUNT(*), SUM(length(payload)), MIN(created_at) "
                "FROM items GROUP BY destination, kind").fetchall()
            now, dropped = self._clock(), dict(self._dropped)
        return _stats(rows, now, dropped)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ---- internals (called with the lock held) -------------------------------------------

    def _make_room(self, destination: str, kind: str, size: int) -> int:
        """Evict what the policies allow so one more item of ``size`` bytes fits; raise
        :class:`OutboxError` (nothing changed: the caller's transaction rolls back) if not."""
        over_items = self._count + 1 - self.max_items
        over_bytes = self._bytes + size - self.max_bytes
        if over_items <= 0 and over_bytes <= 0:
            return 0
        victims = self._eviction_plan(kind, over_items, over_bytes) \
            if size <= self.max_bytes else None
        if victims is None:
            raise self._full(destination, kind, size)
        self._forget(self._delete_rows(victims))
        return len(victims)

    def _eviction_plan(self, kind: str, over_items: int, over_bytes: int) -> list[int] | None:
        """The ids to evict, oldest first (the same kind's, then the other ``drop_oldest``
        kinds'), so that both excesses reach zero; None when the evictable items are not
        enough."""
        victims: list[int] = []
        for kinds in self._evictable_groups(kind):
            cursor = self._conn.execute(
                f"SELECT id, length(payload) FROM items WHERE kind IN ({_marks(kinds)}) "
                "ORDER BY id", kinds)
            for row_id, n in cursor:
                victims.append(row_id)
                over_items, over_bytes = over_items - 1, over_bytes - n
                if over_items <= 0 and over_bytes <= 0:
                    cursor.close()
                    return victims
        return None

    def _evictable_groups(self, kind: str) -> Iterator[list[str]]:
        if self.policy(kind) == "drop_oldest":
            yield [kind]
        others = [k for (k,) in self._conn.execute("SELECT DISTINCT kind FROM items").fetchall()
                  if k != kind and self.policy(k) == "drop_oldest"]
        for start in range(0, len(others), _CHUNK):
            yield others[start:start + _CHUNK]

    def _full(self, destination: str, kind: str, size: int) -> OutboxError:
        self._report("refused", 1)
        why = (f"the item ({size} bytes) is larger than max_bytes={self.max_bytes}"
               if size > self.max_bytes else
               f"it holds {self._count}/{self.max_items} items, {self._bytes}/"
               f"{self.max_bytes} bytes and nothing may be evicted for kind {kind!r} "
               f"(policy {self.policy(kind)!r})")
        return OutboxError(
            f"outbox {self.path} refused an item of kind {kind!r} for {destination!r}: {why}",
            hint="the item was NOT accepted: keep it or retry later; raise max_items / "
                 "max_bytes, or give expendable kinds the drop_oldest policy",
            destination=destination, kind=kind)

    def _insert(self, destination: str, kind: str, payload: bytes, key: str, now: float,
                expires_at: float) -> int:
        cur = self._conn.execute(
            "INSERT INTO items (destination, idempotency_key, kind, payload, created_at, "
            "expires_at, attempts, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, 0, ?)",
            (destination, key, kind, sqlite3.Binary(payload), now, expires_at, now))
        return int(cast(int, cur.lastrowid))

    def _delete_ids(self, ids: Sequence[int], action: str, reason: str | None) -> int:
        if not ids:
            return 0
        with self._lock, self._guard(action):
            with self._transaction("NORMAL"):
                sizes = self._delete_rows(list(ids))
            self._forget(sizes)
            if reason is not None:
                self._report(reason, len(sizes))
            return len(sizes)

    def _delete_rows(self, ids: list[int]) -> list[int]:
        """Delete rows by id (inside a transaction); the payload sizes of those deleted."""
        sizes: list[int] = []
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start:start + _CHUNK]
            sizes += [n for (n,) in self._conn.execute(
                f"DELETE FROM items WHERE id IN ({_marks(chunk)}) RETURNING length(payload)",
                chunk).fetchall()]
        return sizes

    def _forget(self, sizes: Sequence[int]) -> None:
        self._count -= len(sizes)
        self._bytes -= sum(sizes)

    def _report(self, reason: str, n: int) -> None:
        if n > 0:
            self._dropped[reason] = self._dropped.get(reason, 0) + n
            self._observer.on_dropped(reason, n)

    def _by_key(self, key: str) -> Item | None:
        row = self._conn.execute(f"SELECT {_COLUMNS} FROM items WHERE idempotency_key = ?",
                                 (key,)).fetchone()
        return None if row is None else _item(row)

    def _totals(self) -> tuple[int, int]:
        with self._guard("count items"):
            n, size = self._conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(length(payload)), 0) FROM items").fetchone()
        return int(n), int(size)

    def _transaction(self, sync: str) -> AbstractContextManager[None]:
        """One write transaction, committed with ``PRAGMA synchronous=<sync>``."""
        return write_transaction(self._conn, sync)

    def _guard(self, action: str) -> AbstractContextManager[None]:
        return mapped_errors(lambda message: OutboxError(
            message, hint="is the disk full or failing? see the node's log"),
            f"outbox {self.path}: could not {action}")


def _connect(path: str) -> sqlite3.Connection:
    """Open (creating if needed) the outbox database, in WAL mode, schema checked."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are explicit (see Outbox._transaction). Used from
        # several threads, serialised by the outbox's lock.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise OutboxError(f"cannot open outbox {path}: {exc}",
                          hint="check that the node's state directory is writable") from exc
    try:
        _prepare(conn, path)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise OutboxError(f"cannot open outbox {path}: {exc}",
                              hint="is it an outbox file? move it away to start empty") from exc
        raise
    return conn


def _prepare(conn: sqlite3.Connection, path: str) -> None:
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise OutboxError(f"outbox {path} cannot use a write-ahead log (journal mode {mode})",
                          hint="put the outbox on a local file system")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=5000")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise OutboxError(f"outbox {path} has schema version {version}, newer than this "
                          f"tierlink's {SCHEMA_VERSION}", hint="upgrade tierlink")
    conn.execute("BEGIN IMMEDIATE")
    for statement in _SCHEMA:
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.execute("COMMIT")


def _policies(full_policy: FullPolicy | Mapping[str, FullPolicy]) -> dict[str, FullPolicy]:
    """The policy per kind (``"*"``: the default), validated."""
    mapping = {"*": full_policy} if isinstance(full_policy, str) else dict(full_policy)
    for kind, policy in mapping.items():
        if policy not in FULL_POLICIES:
            raise ConfigError(f"outbox full_policy for kind {kind!r} is {policy!r}; "
                              f"expected one of {', '.join(FULL_POLICIES)}")
    return cast(dict[str, FullPolicy], mapping)


def _positive_int(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"outbox {name} must be a positive integer, got {value!r}")
    return value


def _check_item(destination: str, kind: str, payload: bytes, ttl_s: float | None) -> None:
    if not destination or not kind:
        raise ValueError("an outbox item needs a non-empty destination and kind")
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"an outbox payload is bytes, got {type(payload).__name__}")
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")


def _same_item(existing: Item, destination: str, kind: str) -> Item:
    """An idempotent re-put returns the waiting item; a key reused for something else is
    a caller's bug, reported rather than hidden."""
    if (existing.destination, existing.kind) != (destination, kind):
        raise OutboxError(
            f"idempotency key {existing.key} is already waiting for {existing.destination!r} "
            f"as kind {existing.kind!r}, not {destination!r} / {kind!r}",
            hint="use a fresh key for a different item")
    return existing


def _item(row: tuple[object, ...]) -> Item:
    (item_id, destination, key, kind, payload, created_at, expires_at, attempts,
     next_attempt_at, last_error) = row
    return Item(int(cast(int, item_id)), str(destination), str(key), str(kind),
                bytes(cast(bytes, payload)), float(cast(float, created_at)),
                float(cast(float, expires_at)), int(cast(int, attempts)),
                float(cast(float, next_attempt_at)),
                None if last_error is None else str(last_error))


def _stats(rows: list[tuple[str, str, int, int, float]], now: float,
           dropped: dict[str, int]) -> OutboxStats:
    by_dest: dict[str, Counts] = {}
    by_kind: dict[str, Counts] = {}
    oldest: float | None = None
    for dest, kind, n, size, first in rows:
        for table, name in ((by_dest, dest), (by_kind, kind)):
            c = table.get(name, Counts())
            table[name] = Counts(c.items + n, c.bytes + size)
        oldest = first if oldest is None else min(oldest, first)
    return OutboxStats(items=sum(c.items for c in by_dest.values()),
                       bytes=sum(c.bytes for c in by_dest.values()),
                       by_destination=by_dest, by_kind=by_kind,
                       oldest_age_s=None if oldest is None else max(0.0, now - oldest),
                       dropped=dropped)


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" * len(values))
