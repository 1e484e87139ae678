"""Where the registry keeps its nodes: a small store interface and its SQLite implementation.

The control plane calls a :class:`RegistryStore` from request handlers (a worker thread
each) and from its expiry task (the event loop), so an implementation must be thread-safe.
Time is never read here: every time-dependent method takes ``now`` (epoch seconds) from the
app's injected clock, which is what lets tests and the simulator drive expiry.

Life of an entry (one row per node id, ever):

    (none) --upsert--> alive --expire / silent > ttl--> expired --upsert--> alive (generation+1)
                         |  \\--upsert with a new started_at--> alive (generation+1)
                         \\--remove--> deregistered --upsert--> alive (generation+1)

Expired and deregistered rows are kept as tombstones (for ``tombstone_retention_s``) so a
node that comes back gets a *higher* generation rather than starting over at 1.

The same database holds the **hard-example store** (:class:`SqliteHardExampleStore`, table
``hard_examples``, schema version 2): inputs nodes escalated for low confidence, capped at
``max_rows`` (the oldest are evicted, so a disk never fills silently). It has a connection
of its own, so an export reading many rows never delays a heartbeat.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tierlink.control.schemas import HardExampleIn, HardExampleRecord, Heartbeat, NodeRecord
from tierlink.errors import ControlPlaneError

# 1: nodes. 2: + hard_examples. 3: + drains. (Tables are created on open: an older file
# is upgraded in place.)
SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node_id       TEXT PRIMARY KEY,
    tier          TEXT NOT NULL,
    heartbeat     TEXT NOT NULL,   -- JSON: the last Heartbeat, extras included
    started_at    REAL NOT NULL,
    registered_at REAL NOT NULL,   -- when the current generation registered
    last_seen     REAL NOT NULL,
    generation    INTEGER NOT NULL,
    state         TEXT NOT NULL    -- 'alive' | 'expired' | 'deregistered'
)
"""

_HARD_EXAMPLES_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS hard_examples (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, even after eviction
    request_id  TEXT NOT NULL,
    row         INTEGER NOT NULL,                   -- index in the request's batch
    node_id     TEXT NOT NULL,
    model       TEXT NOT NULL,
    task        TEXT NOT NULL,
    privacy     TEXT NOT NULL,
    prediction  INTEGER NOT NULL,
    confidence  REAL NOT NULL,
    threshold   REAL,
    label       INTEGER NOT NULL,                   -- -1: unknown
    created_at  REAL NOT NULL,                      -- at the node
    received_at REAL NOT NULL,
    datatype    TEXT NOT NULL,
    shape       TEXT NOT NULL,                      -- JSON list
    data        BLOB NOT NULL,                      -- raw little-endian bytes
    -- a batch re-sent after a lost answer is stored once
    UNIQUE (node_id, request_id, model, row, created_at)
)
""",
    "CREATE INDEX IF NOT EXISTS hard_examples_by_model ON hard_examples (model, id)",
)

_DRAINS_SCHEMA = "CREATE TABLE IF NOT EXISTS drains (node_id TEXT PRIMARY KEY, since REAL)"

_COLUMNS = "node_id, heartbeat, registered_at, last_seen, generation"


class RegistryStore(Protocol):
    """The registry's storage. Implementations: :class:`SqliteRegistryStore` (embedded
    default); :class:`~tierlink.control.etcd_store.EtcdRegistryStore`, for control-plane
    replicas that share one view."""

    def upsert(self, heartbeat: Heartbeat, now: float, ttl_s: float | None = None) -> NodeRecord:
        """Record a heartbeat. Starts a new generation when the node is new, was expired
        or deregistered, restarted (new ``started_at``), or has been silent longer than
        ``ttl_s`` (when given) even if no expiry sweep ran yet."""
        ...

    def repeat(self, node_id: str, now: float, ttl_s: float) -> NodeRecord | None:
        """The node sent the very heartbeat it sent last: note that it was heard at ``now``
        and return its record, as cheaply as the store can; None when that is not enough
        (unknown, expired, silent past ``ttl_s``, or a write is due): then :meth:`upsert`."""
        ...

    def alive(self, now: float, ttl_s: float) -> list[NodeRecord]:
        """Nodes heard from within ``ttl_s`` of ``now`` and not removed, by node id."""
        ...

    def alive_json(self, now: float, ttl_s: float, *, digests: bool = False) -> list[str]:
        """:meth:`alive` as the JSON text of each record (what ``GET /v1/nodes`` lists);
        ``digests``: each model's ``splits`` replaced by ``splits_digest`` (see
        :meth:`split_profile`)."""
        ...

    def split_profile(self, digest: str) -> str | None:
        """The JSON text of the split profile (a model's ``splits`` list) with this digest,
        as some alive node last reported it; None when none has."""
        ...

    def get(self, node_id: str, now: float) -> NodeRecord | None:
        """The node's entry if it is registered (not expired by a sweep, not removed).
        Staleness is not judged here: callers compare ``age_s`` with their ttl."""
        ...

    def remove(self, node_id: str) -> bool:
        """Deregister a node; False when it was not registered."""
        ...

    def expire(self, now: float, ttl_s: float) -> list[str]:
        """Mark nodes silent for longer than ``ttl_s`` as expired; returns their ids, sorted."""
        ...

    def drain(self, node_id: str, draining: bool) -> bool:
        """Mark a node drained (peers send it no new work) or undo it; kept across the
        node's restarts. False when nothing changed."""
        ...

    def view_revision(self) -> str:
        """A token that changes whenever what ``alive_json`` lists does (a node joins,
        leaves, restarts, sends a changed heartbeat, is drained), and only then: the
        ``since`` a watching node sends back (``GET /v1/nodes?since=...&wait=...``)."""
        ...

    def close(self) -> None:
        """Release the store; it must not be used afterwards."""
        ...


class SqliteRegistryStore:
    """:class:`RegistryStore` in one SQLite file (WAL mode), or ``":memory:"`` for tests.

    One connection guarded by a lock: every operation is a single tiny statement or
    transaction, so serialising them costs less than a connection per thread would.
    WAL with ``synchronous=NORMAL`` survives a crash of the process (not necessarily a power
    loss, which only costs the last heartbeats: nodes send them again every second).

    Every node reads the whole registry every second, so a read must not validate every
    record again: the last heartbeat of each node is kept decoded beside the stored text
    (validated once, when it arrived or when first read after a restart), with a second
    text whose split profiles are replaced by their digests; the profiles themselves are
    kept by digest (in memory: every node sends its own with each heartbeat).
    """

    def __init__(self, path: str | Path, *, tombstone_retention_s: float = 86_400.0) -> None:
        self.path = str(path)
        self.tombstone_retention_s = tombstone_retention_s
        self._lock = threading.Lock()
        self._conn = _connect(self.path)
        self._decoded: dict[str, Decoded] = {}  # node id -> its last heartbeat
        self._profiles: dict[str, str] = {}  # digest -> a split profile's JSON text
        self._drained = {row[0] for row in self._conn.execute("SELECT node_id FROM drains")}
        self._epoch = uuid.uuid4().hex[:12]  # a restarted store never repeats a revision
        self._changes = 0

    # -- RegistryStore ---------------------------------------------------------------------

    def upsert(self, heartbeat: Heartbeat, now: float, ttl_s: float | None = None) -> NodeRecord:
        body = heartbeat.model_dump_json()
        with self._lock, self._guard("record a heartbeat"), self._conn:
            row = self._conn.execute(
                "SELECT started_at, registered_at, last_seen, generation, state"
                " FROM nodes WHERE node_id = ?",
                (heartbeat.node_id,),
            ).fetchone()
            registered_at, generation = _next_generation(row, heartbeat, now, ttl_s)
            previous = self._decoded.get(heartbeat.node_id)
            if previous is None or previous.body != body or row is None \
                    or (row[3], row[4]) != (generation, "alive"):
                self._changes += 1
            self._conn.execute(
                "INSERT INTO nodes (node_id, tier, heartbeat, started_at, registered_at,"
                " last_seen, generation, state) VALUES (?, ?, ?, ?, ?, ?, ?, 'alive')"
                " ON CONFLICT(node_id) DO UPDATE SET tier = excluded.tier,"
                " heartbeat = excluded.heartbeat, started_at = excluded.started_at,"
                " registered_at = excluded.registered_at, last_seen = excluded.last_seen,"
                " generation = excluded.generation, state = 'alive'",
                (heartbeat.node_id, heartbeat.tier, body, heartbeat.started_at,
                 registered_at, now, generation),
            )
            self._remember(heartbeat.node_id, body, heartbeat)
        return record(heartbeat, registered_at, now, generation, now,
                      heartbeat.node_id in self._drained)

    def repeat(self, node_id: str, now: float, ttl_s: float) -> NodeRecord | None:
        with self._lock, self._guard("record a heartbeat"), self._conn:
            row = self._conn.execute(
                "UPDATE nodes SET last_seen = ? WHERE node_id = ? AND state = 'alive'"
                " AND last_seen >= ? RETURNING registered_at, generation",
                (now, node_id, now - ttl_s)).fetchone()
            decoded = self._decoded.get(node_id)
        if row is None or decoded is None:
            return None
        return record(decoded.heartbeat, row[0], now, row[1], now, node_id in self._drained)

    def alive(self, now: float, ttl_s: float) -> list[NodeRecord]:
        with self._lock, self._guard("list nodes"):
            return [self._record_from_row(row, now) for row in self._alive_rows(now, ttl_s)]

    def alive_json(self, now: float, ttl_s: float, *, digests: bool = False) -> list[str]:
        """The stored heartbeat texts with the registry's fields spliced in: no decoding,
        no validation (they were validated when they arrived)."""
        with self._lock, self._guard("list nodes"):
            texts = [(node_id, self._decode(node_id, body).lite if digests else body, *rest)
                     for node_id, body, *rest in self._alive_rows(now, ttl_s)]
            drained = set(self._drained)
        return [record_json(text, registered_at, last_seen, generation, now,
                            node_id in drained)
                for node_id, text, registered_at, last_seen, generation in texts]

    def split_profile(self, digest: str) -> str | None:
        with self._lock:
            return self._profiles.get(digest)

    def get(self, node_id: str, now: float) -> NodeRecord | None:
        with self._lock, self._guard("read a node"):
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM nodes WHERE node_id = ? AND state = 'alive'",
                (node_id,),
            ).fetchone()
            return None if row is None else self._record_from_row(row, now)

    def _alive_rows(self, now: float, ttl_s: float) -> list[Any]:
        """Under the lock: the rows of nodes heard from within ``ttl_s``, by node id."""
        return self._conn.execute(
            f"SELECT {_COLUMNS} FROM nodes WHERE state = 'alive' AND last_seen >= ?"
            " ORDER BY node_id", (now - ttl_s,)).fetchall()

    def _record_from_row(self, row: tuple[str, str, float, float, int],
                         now: float) -> NodeRecord:
        """Under the lock: the row's record, its heartbeat decoded once per stored text."""
        node_id, body, registered_at, last_seen, generation = row
        return record(self._decode(node_id, body).heartbeat, registered_at, last_seen,
                      generation, now, node_id in self._drained)

    def _decode(self, node_id: str, body: str) -> Decoded:
        """Under the lock: the node's heartbeat as stored in ``body``, decoded once."""
        cached = self._decoded.get(node_id)
        if cached is None or cached.body != body:
            cached = self._remember(node_id, body, Heartbeat.model_validate_json(body))
        return cached

    def _remember(self, node_id: str, body: str, heartbeat: Heartbeat) -> Decoded:
        """Under the lock (or the write transaction): keep the decoded heartbeat, its text
        with profiles by digest, and the profiles (those no node reports any more go)."""
        lite, profiles = by_digest(heartbeat)
        decoded = Decoded(body, heartbeat, lite, frozenset(profiles), profiles)
        old = self._decoded.get(node_id)
        self._decoded[node_id] = decoded
        self._profiles.update(profiles)
        if old is not None and old.digests - decoded.digests:
            held = set().union(*(d.digests for d in self._decoded.values()))
            for digest in old.digests - held:
                self._profiles.pop(digest, None)
        return decoded

    def remove(self, node_id: str) -> bool:
        with self._lock, self._guard("deregister a node"), self._conn:
            cursor = self._conn.execute(
                "UPDATE nodes SET state = 'deregistered' WHERE node_id = ? AND state = 'alive'",
                (node_id,),
            )
            self._changes += cursor.rowcount > 0
        return cursor.rowcount > 0

    def expire(self, now: float, ttl_s: float) -> list[str]:
        with self._lock, self._guard("expire silent nodes"), self._conn:
            ids = [
                row[0]
                for row in self._conn.execute(
                    "UPDATE nodes SET state = 'expired' WHERE state = 'alive' AND last_seen < ?"
                    " RETURNING node_id",
                    (now - ttl_s,),
                )
            ]
            self._changes += bool(ids)
            # Forget tombstones nobody came back for, so ephemeral ids do not pile up.
            self._conn.execute(
                "DELETE FROM nodes WHERE state != 'alive' AND last_seen < ?",
                (now - self.tombstone_retention_s,),
            )
        return sorted(ids)

    def drain(self, node_id: str, draining: bool) -> bool:
        with self._lock, self._guard("drain a node"), self._conn:
            if draining == (node_id in self._drained):
                return False
            if draining:
                self._conn.execute("INSERT INTO drains VALUES (?, strftime('%s','now'))",
                                   (node_id,))
                self._drained.add(node_id)
            else:
                self._conn.execute("DELETE FROM drains WHERE node_id = ?", (node_id,))
                self._drained.discard(node_id)
            self._changes += 1
        return True

    def view_revision(self) -> str:
        return f"{self._epoch}:{self._changes}"

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- helpers ---------------------------------------------------------------------------

    def _guard(self, action: str) -> AbstractContextManager[None]:
        return _sqlite_errors(self.path, action)


def _connect(path: str) -> sqlite3.Connection:
    """Open (creating if needed) the registry database and check its schema version."""
    try:
        # Used from several threads, serialised by the store's lock.
        conn = sqlite3.connect(path, check_same_thread=False)
    except sqlite3.Error as exc:
        raise _open_failed(path, exc) from exc
    try:
        _prepare(conn, path)
    except sqlite3.Error as exc:
        conn.close()
        raise _open_failed(path, exc) from exc
    except ControlPlaneError:
        conn.close()
        raise
    return conn


def _prepare(conn: sqlite3.Connection, path: str) -> None:
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=2000")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise ControlPlaneError(
            f"registry database {path} has schema version {version}, newer than this "
            f"tierlink's {SCHEMA_VERSION}",
            hint="upgrade tierlink, or point --db at a new file",
        )
    with conn:
        conn.execute(_SCHEMA)
        for statement in (*_HARD_EXAMPLES_SCHEMA, _DRAINS_SCHEMA):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _open_failed(path: str, exc: sqlite3.Error) -> ControlPlaneError:
    return ControlPlaneError(
        f"cannot open the registry database {path}: {exc}",
        hint="check that the directory exists and is writable, or pass another --db path",
    )


def _next_generation(
    row: tuple[float, float, float, int, str] | None,
    heartbeat: Heartbeat,
    now: float,
    ttl_s: float | None,
) -> tuple[float, int]:
    """``(registered_at, generation)`` after this heartbeat; see the module's state diagram."""
    if row is None:
        return now, 1
    started_at, registered_at, last_seen, generation, state = row
    silent_too_long = ttl_s is not None and now - last_seen > ttl_s
    if state != "alive" or started_at != heartbeat.started_at or silent_too_long:
        return now, generation + 1
    return registered_at, generation


@dataclass(frozen=True, slots=True)
class Decoded:
    body: str  # the stored text
    heartbeat: Heartbeat
    lite: str  # the text with each model's splits replaced by splits_digest
    digests: frozenset[str]
    profiles: dict[str, str]  # digest -> the profile's JSON text


def by_digest(heartbeat: Heartbeat) -> tuple[str, dict[str, str]]:
    """The heartbeat's JSON with each model's non-empty ``splits`` replaced by
    ``splits_digest`` (sha256 of the profile's JSON text, 32 hex digits), and the profiles
    by digest."""
    doc = heartbeat.model_dump(mode="json")
    profiles: dict[str, str] = {}
    for model in doc.get("models", ()):
        splits = model.pop("splits", None)
        if splits:
            text = json.dumps(splits, separators=(",", ":"))
            digest = hashlib.sha256(text.encode()).hexdigest()[:32]
            profiles[digest] = text
            model["splits_digest"] = digest
    return json.dumps(doc, separators=(",", ":")), profiles


def record(
    heartbeat: Heartbeat, registered_at: float, last_seen: float, generation: int, now: float,
    draining: bool = False,
) -> NodeRecord:
    """The registry entry of a validated heartbeat (not validated again: it is read every
    second by every node)."""
    # A clock that steps back must not produce a negative age.
    age_s = max(0.0, now - last_seen)
    return NodeRecord.model_construct(
        **dict(heartbeat), registered_at=registered_at, last_seen=last_seen, age_s=age_s,
        generation=generation, draining=draining)


def record_json(body: str, registered_at: float, last_seen: float, generation: int,
                 now: float, draining: bool = False) -> str:
    """The JSON of :func:`record` from the stored heartbeat text (a JSON object)."""
    fields = {"registered_at": registered_at, "last_seen": last_seen,
              "age_s": max(0.0, now - last_seen), "generation": generation, "draining": draining}
    return json.dumps(fields)[:-1] + "," + body[1:]


@contextmanager
def _sqlite_errors(path: str, action: str, *, what: str = "registry database",
                   hint: str = "check the disk and the file's permissions; restart "
                               "`tierlink control`") -> Iterator[None]:
    """Convert sqlite3 errors raised inside into :class:`ControlPlaneError`."""
    try:
        yield
    except sqlite3.Error as exc:
        raise ControlPlaneError(f"{what} {path} failed to {action}: {exc}", hint=hint) from exc


# -- the hard-example store -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddResult:
    """What one batch did to the store."""

    stored: int
    duplicates: int  # already stored (a retried batch)
    evicted: int  # oldest rows removed to stay within ``max_rows``


@dataclass(frozen=True, slots=True)
class StoredExample:
    """A hard example with its tensor, for export."""

    record: HardExampleRecord
    data: bytes  # raw little-endian bytes of ``record.datatype`` / ``record.shape``


class HardExampleStore(Protocol):
    """Where the control plane keeps hard examples. Thread-safe; ``now`` is injected."""

    def add(self, examples: Sequence[HardExampleIn], now: float) -> AddResult:
        """Store a batch atomically, then evict the oldest rows beyond the cap."""
        ...

    def page(self, *, model: str | None = None, node: str | None = None, after_id: int = 0,
             limit: int = 100) -> list[HardExampleRecord]:
        """Metadata of stored examples with ``id > after_id``, oldest first."""
        ...

    def export(self, *, model: str | None = None, node: str | None = None,
               limit: int | None = None) -> list[StoredExample]:
        """Examples with their tensors, oldest first (at most ``limit``)."""
        ...

    def count(self) -> int: ...

    def close(self) -> None: ...


_RECORD_COLUMNS = ("id, request_id, row, node_id, model, task, privacy, prediction, confidence,"
                   " threshold, label, created_at, received_at, datatype, shape")
_INSERT = ("INSERT OR IGNORE INTO hard_examples (request_id, row, node_id, model, task, privacy,"
           " prediction, confidence, threshold, label, created_at, received_at, datatype, shape,"
           " data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_DISK_HINT = ("check free space and permissions where the control plane's --db lives; lower "
              "the hard-example row cap to keep less. The registry keeps serving")


class SqliteHardExampleStore:
    """:class:`HardExampleStore` in the control plane's SQLite file, at most ``max_rows``.

    Its own connection and lock (WAL: readers do not block the registry's writes)."""

    def __init__(self, path: str | Path, *, max_rows: int = 50_000) -> None:
        if max_rows < 1:
            raise ControlPlaneError(f"the hard-example row cap must be >= 1, got {max_rows}")
        self.path = str(path)
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._conn = _connect(self.path)

    def add(self, examples: Sequence[HardExampleIn], now: float) -> AddResult:
        rows = [_example_row(e, now) for e in examples]  # decode outside the lock
        with self._lock, self._guard(f"store {len(rows)} hard examples"), self._conn:
            before = self._conn.total_changes
            self._conn.executemany(_INSERT, rows)
            stored = self._conn.total_changes - before
            evicted = self._conn.execute(
                "DELETE FROM hard_examples WHERE id <= (SELECT id FROM hard_examples"
                " ORDER BY id DESC LIMIT 1 OFFSET ?)", (self.max_rows,)).rowcount
        return AddResult(stored, len(rows) - stored, max(0, evicted))

    def page(self, *, model: str | None = None, node: str | None = None, after_id: int = 0,
             limit: int = 100) -> list[HardExampleRecord]:
        where, args = _filters(model, node, after_id)
        with self._lock, self._guard("list hard examples"):
            rows = self._conn.execute(
                f"SELECT {_RECORD_COLUMNS} FROM hard_examples WHERE {where}"
                " ORDER BY id LIMIT ?", (*args, limit)).fetchall()
        return [_record_of(row) for row in rows]

    def export(self, *, model: str | None = None, node: str | None = None,
               limit: int | None = None) -> list[StoredExample]:
        where, args = _filters(model, node, 0)
        with self._lock, self._guard("export hard examples"):
            rows = self._conn.execute(
                f"SELECT {_RECORD_COLUMNS}, data FROM hard_examples WHERE {where}"
                " ORDER BY id LIMIT ?", (*args, -1 if limit is None else limit)).fetchall()
        return [StoredExample(_record_of(row[:-1]), bytes(row[-1])) for row in rows]

    def count(self) -> int:
        with self._lock, self._guard("count hard examples"):
            return int(self._conn.execute("SELECT COUNT(*) FROM hard_examples").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _guard(self, action: str) -> AbstractContextManager[None]:
        return _sqlite_errors(self.path, action, what="hard-example store",
                              hint=_DISK_HINT)


def _example_row(e: HardExampleIn, now: float) -> tuple[Any, ...]:
    return (e.request_id, e.row, e.node_id, e.model, e.task, e.privacy, e.prediction,
            e.confidence, e.threshold, e.label, e.created_at, now, e.input.datatype,
            json.dumps(e.input.shape), e.input.raw())


def _filters(model: str | None, node: str | None, after_id: int) -> tuple[str, list[Any]]:
    clauses: list[str] = ["id > ?"]
    args: list[Any] = [after_id]
    if model is not None:
        clauses.append("model = ?")
        args.append(model)
    if node is not None:
        clauses.append("node_id = ?")
        args.append(node)
    return " AND ".join(clauses), args


def _record_of(row: Sequence[Any]) -> HardExampleRecord:
    names = [c.strip() for c in _RECORD_COLUMNS.split(",")]
    values = dict(zip(names, row, strict=True))
    values["shape"] = json.loads(values["shape"])
    return HardExampleRecord.model_validate(values)
