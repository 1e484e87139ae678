"""The registry on etcd: :class:`~tierlink.control.store.RegistryStore` for control-plane
replicas that share one fleet view, and survive losing a machine.

Keys (under ``prefix``, default ``/tierlink/registry/``):

    nodes/<id>        the node's last heartbeat and the registry's fields, attached to the
                      node's **lease**: when the node goes silent the lease runs out and etcd
                      deletes the key itself -- no sweeper, no replica has to be alive for it
    generation/<id>   the node's last generation (no lease: a node that comes back gets a
                      higher one, whichever replica it reaches)
    drain/<id>        present while an operator has the node drained (mirrored by a watch)

Every replica keeps the whole view in memory, fed by a **watch** on the prefix (its own
writes go in at once, so a node reads what it just wrote), and answers reads from it:
``GET /v1/nodes`` never touches etcd. A heartbeat that carries nothing new costs no call:
the replica notes the time, and a renewer thread renews, every half second and in one
call, the leases of the nodes heard at least ``ttl/3`` after their last renewal, and
rewrites ``last_seen`` (so other replicas know how recently a node was heard) of those
heard ``ttl/2`` after it was written. A changed heartbeat is kept at once (this replica's
view has it) and written behind in that same round, 100 nodes to a transaction: other
replicas see it within about half a second (a replica killed in between loses that
change, and the node's next heartbeat, wherever it lands, brings it back: heartbeats are
soft state). A new generation (new node, restart, came back after expiry) is written at
once: a lease grant and a transaction. A node whose heartbeats move to another replica keeps its generation: that
replica renews the lease it finds on the key.

The lease outlives the ttl by ``ttl/3`` (renewals come at most that often), so a silent
node leaves the view between ``ttl`` and ``4/3 ttl`` after its last heartbeat. ``age_s`` is
how long ago the key was written or this replica heard the node, whichever is later.
"""

from __future__ import annotations

import json
import logging
import threading
import zlib
from dataclasses import dataclass, replace

from tierlink.control.schemas import Heartbeat, NodeRecord
from tierlink.control.store import Decoded, by_digest, record, record_json
from tierlink.errors import ControlPlaneError
from tierlink.etcd.client import Compare, Etcd, Event, KeyValue, Op
from tierlink.etcd.mirror import Mirror

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/tierlink/registry/"
RENEW_EVERY_S = 0.5


@dataclass(frozen=True, slots=True)
class _Entry:
    decoded: Decoded
    registered_at: float
    last_seen: float  # when the key was last written
    generation: int
    lease: int
    mod_revision: int
    heard_at: float = 0.0  # when this replica last heard the node (0: only from the watch)
    renewed_at: float = 0.0  # when this replica last renewed its lease
    dirty: bool = False  # a changed heartbeat this replica has not written yet

    @property
    def started_at(self) -> float:
        return self.decoded.heartbeat.started_at

    def seen(self) -> float:
        return max(self.last_seen, self.heard_at)


class EtcdRegistryStore:
    """:class:`~tierlink.control.store.RegistryStore` on an etcd cluster (see the module).

    ``start()`` loads the view and starts the watch; ``close()`` stops the watch (the
    client is the caller's). Thread-safe: one lock for the view, one of 64 per node id for
    a node's writes.
    """

    def __init__(self, etcd: Etcd, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.etcd = etcd
        self.prefix = prefix
        self._nodes = prefix + "nodes/"
        self._generations = prefix + "generation/"
        self._drains = Mirror(etcd, prefix + "drain/")
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._node_locks = [threading.Lock() for _ in range(64)]
        self._entries: dict[str, _Entry] = {}
        self._profiles: dict[str, str] = {}
        self._gone: list[tuple[str, float]] = []  # (id, last seen) deleted by the watch
        self._revision = 0
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._renewer: threading.Thread | None = None
        self._ttl = 5.0  # the control plane's, as its last heartbeat call said
        self._heard: set[str] = set()  # heard here since the renewer last looked at them

    def start(self) -> EtcdRegistryStore:
        self._drains.start()
        revision = self._load()
        self._watcher = threading.Thread(
            target=self.etcd.watch, name="registry-watch", daemon=True,
            args=(self._nodes, revision + 1, self._apply, self._stop, self._load))
        self._watcher.start()
        self._renewer = threading.Thread(target=self._renew_forever, name="registry-renew",
                                         daemon=True)
        self._renewer.start()
        return self

    # -- RegistryStore ---------------------------------------------------------------------

    def upsert(self, heartbeat: Heartbeat, now: float, ttl_s: float | None = None) -> NodeRecord:
        ttl = self._ttl if ttl_s is None else ttl_s
        self._ttl = ttl
        body = heartbeat.model_dump_json()
        with self._node_lock(heartbeat.node_id):
            with self._lock:
                entry = self._entries.get(heartbeat.node_id)
            # The key's presence is the lease's word that the node is alive: a replica
            # that learned it through the watch renews that lease (or re-registers the
            # node when it has run out) at the node's first heartbeat here.
            if entry is None or entry.started_at != heartbeat.started_at:
                entry = self._register(heartbeat, body, now, ttl, entry)
            else:
                entry = self._refresh(entry, heartbeat, body, now, ttl)
        return record(heartbeat, entry.registered_at, entry.seen(), entry.generation, now,
                      self._drained(heartbeat.node_id))

    def repeat(self, node_id: str, now: float, ttl_s: float) -> NodeRecord | None:
        """In memory: the lease is renewed and ``last_seen`` rewritten by :meth:`renew`."""
        with self._lock:
            entry = self._entries.get(node_id)
            if entry is None:
                return None
            entry = replace(entry, heard_at=now)
            self._entries[node_id] = entry
            self._heard.add(node_id)
            self._ttl = ttl_s
        return record(entry.decoded.heartbeat, entry.registered_at, entry.seen(),
                      entry.generation, now, self._drained(node_id))

    def alive(self, now: float, ttl_s: float) -> list[NodeRecord]:
        with self._lock:
            entries = sorted(self._entries.items())
        return [record(e.decoded.heartbeat, e.registered_at, e.seen(), e.generation, now,
                       self._drained(node_id)) for node_id, e in entries]

    def alive_json(self, now: float, ttl_s: float, *, digests: bool = False) -> list[str]:
        with self._lock:
            entries = sorted(self._entries.items())
        return [record_json(e.decoded.lite if digests else e.decoded.body, e.registered_at,
                            e.seen(), e.generation, now, self._drained(node_id))
                for node_id, e in entries]

    def split_profile(self, digest: str) -> str | None:
        with self._lock:
            return self._profiles.get(digest)

    def get(self, node_id: str, now: float) -> NodeRecord | None:
        with self._lock:
            e = self._entries.get(node_id)
        if e is None:
            return None
        return record(e.decoded.heartbeat, e.registered_at, e.seen(), e.generation, now,
                      self._drained(node_id))

    def remove(self, node_id: str) -> bool:
        with self._node_lock(node_id):
            with self._lock:
                entry = self._entries.pop(node_id, None)
                self._changed.notify_all()
            deleted = self.etcd.delete(self._nodes + node_id)
            if entry is not None and entry.lease:
                self.etcd.revoke(entry.lease)
        return deleted > 0 or entry is not None

    def expire(self, now: float, ttl_s: float) -> list[str]:
        """The nodes whose lease ran out since the last call (etcd expires them itself)."""
        with self._lock:
            gone, self._gone = self._gone, []
        # A key deleted soon after its last write was a deregistration, not an expiry.
        return sorted(node_id for node_id, seen in gone if now - seen >= ttl_s)

    def drain(self, node_id: str, draining: bool) -> bool:
        key = self._drains.prefix + node_id
        if draining == self._drained(node_id):
            return False
        if draining:
            revision = self.etcd.put(key, b"1")
            self._drains.note(KeyValue(key, b"1", revision))
        else:
            self.etcd.delete(key)
            self._drains.note(None, node_id)
        with self._lock:
            self._changed.notify_all()
        return True

    def view_revision(self) -> str:
        """etcd's revision the view has caught up with: global to the cluster, so a node
        that moves to another replica keeps its place."""
        with self._lock:
            revision = self._revision
        return f"etcd:{max(revision, self._drains.revision)}"

    def _drained(self, node_id: str) -> bool:
        return self._drains.get(node_id) is not None

    def close(self) -> None:
        self._stop.set()
        self._drains.close()
        for thread in (self._watcher, self._renewer):
            if thread is not None:
                thread.join(timeout=5)

    # -- watching --------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The etcd revision this replica's view has caught up with."""
        with self._lock:
            return self._revision

    def wait_for_change(self, after: int, timeout_s: float) -> int:
        """Block until the view is past revision ``after`` (or ``timeout_s``); the revision."""
        with self._changed:
            self._changed.wait_for(lambda: self._revision > after, timeout=timeout_s)
            return self._revision

    def _load(self) -> int:
        """(Re)read every node; the revision read at."""
        kvs, revision = self.etcd.prefix(self._nodes)
        entries = {}
        for kv in kvs:
            entry = self._entry_of(kv)
            if entry is not None:
                entries[kv.key[len(self._nodes):]] = entry
        with self._lock:
            self._entries = entries
            self._profiles = {}
            for e in entries.values():
                self._profiles.update(e.decoded.profiles)
            self._revision = revision
            self._changed.notify_all()
        return revision

    def _apply(self, events: list[Event], revision: int) -> None:
        """Bring the view up to ``revision`` with the watch's events (ours included).
        Decoded outside the lock, and only what is news: our own writes are in the view
        already, and a heartbeat text the view holds is not parsed again (most writes only
        move ``last_seen``)."""
        decoded = []
        for e in events:
            current = self._entries.get(e.kv.key[len(self._nodes):])  # a read: no lock
            news = e.kind == "put" and (current is None
                                        or current.mod_revision < e.kv.mod_revision)
            decoded.append((e, self._entry_of(e.kv, current) if news else None))
        with self._lock:
            for event, entry in decoded:
                node_id = event.kv.key[len(self._nodes):]
                current = self._entries.get(node_id)
                if current is not None and current.mod_revision >= event.kv.mod_revision:
                    continue  # our own write, already in the view
                if event.kind == "delete":
                    if current is not None:
                        del self._entries[node_id]
                        self._gone.append((node_id, current.seen()))
                    continue
                if entry is not None:
                    if current is not None and current.generation == entry.generation:
                        entry = replace(entry, heard_at=current.heard_at,
                                        renewed_at=current.renewed_at)
                    self._keep(node_id, entry)
            self._revision = max(self._revision, revision)
            self._changed.notify_all()

    # -- writing ---------------------------------------------------------------------------

    def _register(self, heartbeat: Heartbeat, body: str, now: float, ttl: float,
                  old: _Entry | None) -> _Entry:
        """A new generation: a fresh lease, the generation counter moved in one transaction."""
        key = self._generations + heartbeat.node_id
        decoded = _decode(body, heartbeat)
        for _ in range(5):
            counter = self.etcd.get(key)
            generation = 1 + (int(counter.value) if counter else 0)
            lease = self.etcd.grant(ttl + ttl / 3)
            value = _value(decoded.body, now, now, generation)
            guard = Compare(key, "mod", counter.mod_revision) if counter \
                else Compare(key, "version", 0)
            held, revision = self.etcd.txn(
                [guard], [Op("put", key, str(generation).encode()),
                          Op("put", self._nodes + heartbeat.node_id, value, lease)])
            if held:
                break
            self.etcd.revoke(lease)  # another replica registered it first: read again
        else:
            raise ControlPlaneError(f"could not register {heartbeat.node_id}: the generation "
                                    "kept changing under us", hint="retry the heartbeat")
        if old is not None and old.lease and old.lease != lease:
            self.etcd.revoke(old.lease)
        entry = _Entry(decoded, now, now, generation, lease, revision, heard_at=now,
                       renewed_at=now)
        self._keep_locked(heartbeat.node_id, entry)
        log.info("node %s registered in etcd, generation %d", heartbeat.node_id, generation)
        return entry

    def _refresh(self, entry: _Entry, heartbeat: Heartbeat, body: str, now: float,
                 ttl: float) -> _Entry:
        """The same generation: a changed heartbeat is kept here at once (this replica
        answers with it) and written behind, with the others due, by :meth:`renew`."""
        if body != entry.decoded.body:
            entry = replace(entry, decoded=_decode(body, heartbeat), last_seen=now,
                            dirty=True)
        entry = replace(entry, heard_at=now)
        with self._lock:
            self._keep(heartbeat.node_id, entry)
            self._heard.add(heartbeat.node_id)
            self._changed.notify_all()
        return entry

    def renew(self) -> int:
        """One round of upkeep, batched (the renewer thread runs it every
        ``RENEW_EVERY_S``): renew the leases of nodes heard here at least ``ttl/3`` after
        their last renewal, in one call; write the changed heartbeats this replica holds
        and ``last_seen`` of nodes heard ``ttl/2`` after it was last written, 100 to a
        transaction. Returns the leases renewed."""
        ttl = self._ttl
        with self._lock:  # only the nodes heard since the last round: not the whole view
            heard, self._heard = self._heard, set()
            looked = [(n, e) for n in heard if (e := self._entries.get(n)) is not None]
            due = [(n, e) for n, e in looked if e.heard_at - e.renewed_at >= ttl / 3]
            writes = [(n, e) for n, e in looked if e.dirty or (
                e.heard_at and e.heard_at - e.last_seen >= ttl / 2)]
        # A node heard with nothing due is looked at again when it is heard again (a node
        # heard no more is left to its lease: that is how a silent node expires).
        try:
            return self._upkeep(due, writes)
        except Exception:
            with self._lock:
                self._heard |= heard  # not done: the next round tries them again
            raise

    def _upkeep(self, due: list[tuple[str, _Entry]], writes: list[tuple[str, _Entry]]) -> int:
        renewed = self.etcd.keepalive_many([e.lease for _, e in due])
        with self._lock:
            for node_id, e in due:
                current = self._entries.get(node_id)
                if current is not None and current.lease == e.lease and renewed[e.lease] > 0:
                    self._entries[node_id] = replace(current, renewed_at=e.heard_at)
        writes = [(n, e) for n, e in writes if renewed.get(e.lease, 1) > 0]
        for i in range(0, len(writes), 100):
            self._write(writes[i:i + 100])
        return sum(1 for ttl_left in renewed.values() if ttl_left > 0)

    def _write(self, chunk: list[tuple[str, _Entry]]) -> None:
        """Write these entries as this replica holds them (one transaction)."""
        _, revision = self.etcd.txn([], [
            Op("put", self._nodes + n, _value(e.decoded.body, e.registered_at,
                                              max(e.heard_at, e.last_seen), e.generation),
               e.lease) for n, e in chunk])
        with self._lock:
            for node_id, e in chunk:
                current = self._entries.get(node_id)
                if current is not None and current.decoded is e.decoded \
                        and current.generation == e.generation:
                    self._entries[node_id] = replace(
                        current, last_seen=max(e.heard_at, e.last_seen), dirty=False,
                        mod_revision=max(revision, current.mod_revision))

    def _renew_forever(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            try:
                self.renew()
            except ControlPlaneError as exc:  # etcd away: the next round tries again
                log.warning("renewing node leases failed: %s", exc)
            except Exception:  # the thread must outlive any surprise
                log.exception("renewing node leases failed")

    def _keep_locked(self, node_id: str, entry: _Entry) -> None:
        with self._lock:
            current = self._entries.get(node_id)
            if current is None or current.mod_revision <= entry.mod_revision:
                self._keep(node_id, entry)
                self._changed.notify_all()

    def _keep(self, node_id: str, entry: _Entry) -> None:
        """Under the lock: the node's entry, and the split profiles nodes report."""
        old = self._entries.get(node_id)
        self._entries[node_id] = entry
        self._profiles.update(entry.decoded.profiles)
        if old is not None and old.decoded.digests - entry.decoded.digests:
            held = set().union(*(e.decoded.digests for e in self._entries.values()))
            for digest in old.decoded.digests - held:
                self._profiles.pop(digest, None)

    def _entry_of(self, kv: KeyValue, current: _Entry | None = None) -> _Entry | None:
        """A stored key as an entry (its heartbeat parsed unless ``current`` holds the same
        text); None (and a log line) when it cannot be read."""
        try:
            stored = json.loads(zlib.decompress(kv.value))
            body = stored["heartbeat"]
            decoded = current.decoded if current is not None and current.decoded.body == body \
                else _decode(body, Heartbeat.model_validate_json(body))
            return _Entry(decoded, float(stored["registered_at"]), float(stored["last_seen"]),
                          int(stored["generation"]), kv.lease, kv.mod_revision)
        except (ValueError, KeyError, TypeError, zlib.error) as exc:
            log.warning("registry key %s in etcd is unreadable (%s); ignored", kv.key, exc)
            return None

    def _node_lock(self, node_id: str) -> threading.Lock:
        return self._node_locks[hash(node_id) % len(self._node_locks)]


def _decode(body: str, heartbeat: Heartbeat) -> Decoded:
    lite, profiles = by_digest(heartbeat)
    return Decoded(body, heartbeat, lite, frozenset(profiles), profiles)


def _value(body: str, registered_at: float, last_seen: float, generation: int) -> bytes:
    """A node key's value: the heartbeat and the registry's fields, compressed (a view of
    many nodes with split profiles is megabytes of JSON)."""
    return zlib.compress(json.dumps({"heartbeat": body, "registered_at": registered_at,
                                     "last_seen": last_seen, "generation": generation},
                                    separators=(",", ":")).encode(), 1)
