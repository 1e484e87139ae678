"""The fleet's routing configuration as the control plane holds it: numbered revisions.

Each revision is a whole ``routing:`` section (``RoutingConfig.to_dict()``). ``tierlink up``
stores the fleet file's as the first; ``tierlink policy apply|promote|revert`` add more; every
heartbeat answer of a node that runs another revision carries the current one
(``routing: {revision, config}``), and the node swaps to it at once (``node/live_routing.py``).

Only what a node can change while it serves may change from one revision to the next
(:data:`LIVE_KEYS`: the policy and its options, weights, thresholds and cascade records,
the bandit's reward, shadow mode...); a change to anything else (breakers, hedging,
overload, the deadline reserve...) is refused with the keys it touched — those take a
restart with the new file. A policy a revision names is made here first with its options,
so a misspelled name or option is refused before any node hears of it.

Stores: :class:`SqliteRoutingRevisions` (the control plane's SQLite file) and
:class:`EtcdRoutingRevisions` (shared by replicas over etcd).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tierlink.errors import ConfigError, ControlPlaneError, RoutingConflict
from tierlink.settings.routing import LIVE_KEYS, RoutingConfig, parse_routing
from tierlink.sqlite_store import mapped_errors, open_store

__all__ = ["EtcdRoutingRevisions", "RoutingControl", "RoutingRevision",
           "RoutingRevisions", "SqliteRoutingRevisions"]

HISTORY = 50


@dataclass(frozen=True, slots=True)
class RoutingRevision:
    revision: int
    routing: Mapping[str, Any]  # the routing section (RoutingConfig.to_dict())
    at: float  # epoch seconds it was stored
    note: str = ""  # who or what made it: "tierlink up", "apply", "promote", "revert to 3"

    def to_dict(self) -> dict[str, Any]:
        return {"revision": self.revision, "routing": dict(self.routing), "at": self.at,
                "note": self.note}


class RoutingRevisions(Protocol):
    def latest(self) -> RoutingRevision | None: ...

    def append(self, routing: Mapping[str, Any], at: float, note: str) -> RoutingRevision: ...

    def history(self, limit: int = HISTORY) -> list[RoutingRevision]: ...  # newest first

    def close(self) -> None: ...


_SCHEMA = ("""
CREATE TABLE IF NOT EXISTS routing_revisions (
    revision INTEGER PRIMARY KEY AUTOINCREMENT,
    routing  TEXT NOT NULL,     -- the routing section as JSON
    at       REAL NOT NULL,
    note     TEXT NOT NULL
)
""",)


class SqliteRoutingRevisions:
    """Revisions in the SQLite file at ``path`` (``":memory:"`` for tests); thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._conn = open_store(self.path, _SCHEMA, ControlPlaneError, "routing store")

    def latest(self) -> RoutingRevision | None:
        rows = self._select("ORDER BY revision DESC LIMIT 1")
        return rows[0] if rows else None

    def append(self, routing: Mapping[str, Any], at: float, note: str) -> RoutingRevision:
        with self._lock, self._errors("store a routing revision"), self._conn:
            cursor = self._conn.execute(
                "INSERT INTO routing_revisions (routing, at, note) VALUES (?, ?, ?)",
                (json.dumps(dict(routing)), at, note))
        return RoutingRevision(int(cursor.lastrowid or 0), dict(routing), at, note)

    def history(self, limit: int = HISTORY) -> list[RoutingRevision]:
        return self._select("ORDER BY revision DESC LIMIT ?", (limit,))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _select(self, tail: str, args: tuple[Any, ...] = ()) -> list[RoutingRevision]:
        with self._lock, self._errors("read the routing revisions"):
            rows = self._conn.execute(
                f"SELECT revision, routing, at, note FROM routing_revisions {tail}",
                args).fetchall()
        return [_decode(int(r[0]), r[1], float(r[2]), str(r[3])) for r in rows]

    def _errors(self, action: str) -> Any:
        return mapped_errors(lambda message: ControlPlaneError(
            message, hint="check the disk and the permissions of the control plane's --db "
                          "file"), f"routing store {self.path} failed to {action}")


class EtcdRoutingRevisions:
    """Revisions on etcd (``<prefix>next`` the last number handed out, ``<prefix>r/<10
    digits>`` each revision as JSON); an append is a transaction on the counter, so two
    replicas never hand out one number twice."""

    def __init__(self, etcd: Any, *, prefix: str = "/tierlink/routing/") -> None:
        self.etcd, self.prefix = etcd, prefix

    def latest(self) -> RoutingRevision | None:
        rows = self.history(1)
        return rows[0] if rows else None

    def append(self, routing: Mapping[str, Any], at: float, note: str) -> RoutingRevision:
        from tierlink.etcd.client import Compare, Op

        counter_key = self.prefix + "next"
        for _ in range(10):
            counter = self.etcd.get(counter_key)
            number = 1 + (int(counter.value) if counter else 0)
            doc = json.dumps({"routing": dict(routing), "at": at, "note": note})
            guard = Compare(counter_key, "mod", counter.mod_revision) if counter \
                else Compare(counter_key, "version", 0)
            held, _ = self.etcd.txn([guard], [Op("put", counter_key, str(number).encode()),
                                              Op("put", self._key(number), doc.encode())])
            if held:
                return RoutingRevision(number, dict(routing), at, note)
        raise ControlPlaneError("could not store a routing revision: another replica kept "
                                "storing them", hint="retry")

    def history(self, limit: int = HISTORY) -> list[RoutingRevision]:
        kvs, _ = self.etcd.prefix(self.prefix + "r/")
        out = []
        for kv in sorted(kvs, key=lambda kv: kv.key, reverse=True)[:limit]:
            doc = json.loads(kv.value)
            out.append(_decode(int(kv.key.rsplit("/", 1)[1]), json.dumps(doc["routing"]),
                               float(doc["at"]), str(doc.get("note", ""))))
        return out

    def close(self) -> None:
        pass

    def _key(self, number: int) -> str:
        return f"{self.prefix}r/{number:010d}"


def _decode(revision: int, text: str, at: float, note: str) -> RoutingRevision:
    try:
        routing = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"routing revision {revision} does not decode: {exc}") from None
    return RoutingRevision(revision, routing, at, note)


class RoutingControl:
    """The revisions and what may change between them (see the module). ``current`` is
    read from the store at most every ``cache_s`` (each heartbeat asks for it)."""

    def __init__(self, store: RoutingRevisions, clock: Callable[[], float] = time.time,
                 cache_s: float = 0.2) -> None:
        self.store, self.clock, self.cache_s = store, clock, cache_s
        self._cached: tuple[float, RoutingRevision | None] | None = None
        self._lock = threading.Lock()

    def current(self) -> RoutingRevision | None:
        now = time.monotonic()
        cached = self._cached
        if cached is None or now - cached[0] > self.cache_s:
            cached = self._cached = (now, self.store.latest())
        return cached[1]

    def for_node(self, running: int) -> dict[str, Any] | None:
        """What a heartbeat answer tells a node that runs revision ``running``: the current
        revision when it is another, else nothing."""
        current = self.current()
        if current is None or current.revision == running:
            return None
        return {"revision": current.revision, "config": dict(current.routing)}

    def apply(self, routing: Mapping[str, Any], note: str, *,
              start: bool = False) -> RoutingRevision:
        """A new revision from a ``routing:`` section; ``ConfigError`` (400) naming the key
        when it does not parse, makes no policy, or changes what needs a restart (unless
        the fleet ``start``s with it)."""
        parsed = parse_routing(routing)
        _check_policies(parsed)
        with self._lock:
            base = self.store.latest()
            if base is not None and not start:
                _check_live_only(parse_routing(base.routing), parsed, base.revision)
            made = self.store.append(parsed.to_dict(), self.clock(), note)
            self._cached = None
        return made

    def revert(self, note: str = "") -> RoutingRevision:
        """A new revision with the previous one's configuration; 409 when there is none."""
        with self._lock:
            last = self.store.history(2)
            if len(last) < 2:
                raise RoutingConflict("there is no earlier routing revision to go back to",
                                      hint="`tierlink policy apply FLEET` sets one")
            made = self.store.append(last[1].routing, self.clock(),
                                     note or f"revert to {last[1].revision}")
            self._cached = None
        return made


def _check_policies(routing: RoutingConfig) -> None:
    """Make the revision's policies as a node would: an unknown name or option is the
    caller's mistake, found here rather than on every node."""
    from tierlink.policy import REGISTRY

    config = routing.policy_config()
    REGISTRY.create(routing.policy, config, routing.policy_options)
    if routing.shadow is not None:
        REGISTRY.create(routing.shadow.policy, config, routing.shadow.options)


def _check_live_only(base: RoutingConfig, new: RoutingConfig, revision: int) -> None:
    before, after = base.to_dict(), new.to_dict()
    fixed = sorted(k for k in set(before) | set(after)
                   if k not in LIVE_KEYS and before.get(k) != after.get(k))
    if fixed:
        raise ConfigError(
            f"routing.{', routing.'.join(fixed)} cannot change on a running fleet "
            f"(revision {revision} has other values)",
            hint=f"live changes take {', '.join(LIVE_KEYS)}; restart the fleet with the new "
                 "file for the rest")
