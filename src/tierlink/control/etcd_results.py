"""Delivered results on etcd: what replicas of the control plane share of store-and-forward.

The same contract as :class:`~tierlink.control.results.ResultStore` (each key once, pages in
arrival order, handed-off kinds passed to their handler once per key, at most ``max_rows``
stored items), on an :class:`~tierlink.etcd.log.EtcdLog` under ``/tierlink/results/``: a
node may deliver to any replica and a client read its result from any other.

Retention is etcd's: items and keys are put on a lease that ends ``retention_s`` after the
window they arrived in (one lease per window of ``retention_s / 24``, so a busy fleet does
not make a lease per item), and etcd deletes them then -- those evictions are not counted
in :meth:`take_evicted`, which counts the row cap's. Every write is acknowledged by a
majority of etcd's members before the answer, as SQLite's ``synchronous=FULL`` is here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from tierlink.control.results import DEFAULT_MAX_ROWS, Handlers, ItemHandler, StoredResult
from tierlink.errors import ConfigError, ControlPlaneError, InvalidRequest
from tierlink.etcd.client import Etcd
from tierlink.etcd.log import Entry, EtcdLog
from tierlink.outbox import Ack, AckStatus, wire
from tierlink.outbox.inbox import DEFAULT_RETENTION_S

DEFAULT_PREFIX = "/tierlink/results/"
WINDOWS = 24  # leases per retention period

T = TypeVar("T")


class EtcdResultStore:
    """Delivered items in etcd (see the module). Thread-safe."""

    def __init__(self, etcd: Etcd, *, prefix: str = DEFAULT_PREFIX,
                 retention_s: float = DEFAULT_RETENTION_S, max_rows: int = DEFAULT_MAX_ROWS,
                 clock: Callable[[], float] = time.time) -> None:
        if max_rows < 1 or not retention_s > 0:
            raise ConfigError(f"the result store needs max_rows >= 1 and retention_s > 0, got "
                              f"{max_rows} and {retention_s}")
        self.etcd = etcd
        self.log = EtcdLog(etcd, prefix)
        self.retention_s = float(retention_s)
        self.max_rows = int(max_rows)
        self._clock = clock
        self._lock = threading.Lock()
        self._lease: tuple[int, int] | None = None  # (window, lease id)
        self._evicted = 0

    def add(self, batch: wire.Batch, handlers: Handlers | None = None) -> list[Ack]:
        """Apply a batch's new items; acks in item order (see ``ResultStore.add``)."""
        handlers = handlers or {}
        now = self._clock()
        acks: dict[int, Ack] = {}
        stored: list[tuple[int, wire.WireItem]] = []
        for i, entry in enumerate(batch.entries):
            if isinstance(entry, wire.Rejected):
                acks[i] = Ack(entry.key, AckStatus.REJECTED, entry.detail)
            elif entry.kind in handlers:
                acks[i] = self._hand_off(batch.sender, entry, handlers[entry.kind], now)
            else:
                stored.append((i, entry))
        if stored:
            values = [(item.key, _value(batch.sender, item, now)) for _, item in stored]
            numbers = self._with_lease(lambda lease: self.log.append(values, lease=lease), now)
            for (i, item), number in zip(stored, numbers, strict=True):
                acks[i] = Ack(item.key, AckStatus.DUPLICATE if number is None else AckStatus.OK)
            evicted = len(self.log.trim(self.max_rows, forget_keys=False))
            with self._lock:
                self._evicted += evicted
        return [acks[i] for i in range(len(batch.entries))]

    def get(self, key: str) -> StoredResult | None:
        entry = self.log.find(key)
        return None if entry is None else _stored(entry)

    def page(self, after: int = 0, limit: int = 100) -> list[StoredResult]:
        """Up to ``limit`` items with ``seq > after``, in arrival order."""
        return [_stored(e) for e in self.log.after(after, limit)]

    def count(self) -> int:
        return self.log.count()

    def take_evicted(self) -> int:
        """Items evicted over the row cap since the last call."""
        with self._lock:
            n, self._evicted = self._evicted, 0
        return n

    def close(self) -> None:
        """Nothing to close: the etcd client is the caller's."""

    def _hand_off(self, sender: str, item: wire.WireItem, handler: ItemHandler,
                  now: float) -> Ack:
        """Pass a key not seen before to ``handler``, then remember it. A crash in between
        hands it over again on redelivery (the handler knows its own content)."""
        if self.log.holds(item.key):
            return Ack(item.key, AckStatus.DUPLICATE)
        try:
            applied = handler(item, sender)
        except InvalidRequest as exc:
            return Ack(item.key, AckStatus.REJECTED, exc.message)
        self._with_lease(lambda lease: self.log.remember(item.key, lease=lease), now)
        return Ack(item.key, AckStatus.OK if applied else AckStatus.DUPLICATE)

    def _with_lease(self, write: Callable[[int], T], now: float) -> T:
        """``write(lease)`` on the current window's lease; once more on a new lease when
        etcd no longer knows that one (it was revoked, or etcd lost its data)."""
        try:
            return write(self._window_lease(now))
        except ControlPlaneError as exc:
            if "lease not found" not in str(exc):
                raise
            with self._lock:
                self._lease = None
            return write(self._window_lease(now))

    def _window_lease(self, now: float) -> int:
        window_s = self.retention_s / WINDOWS
        window = int(now // window_s)
        with self._lock:
            if self._lease is not None and self._lease[0] == window:
                return self._lease[1]
        # Ends retention_s after the window does: nothing leaves before its time.
        lease = self.etcd.grant(self.retention_s + window_s)
        with self._lock:
            self._lease = (window, lease)
        return lease


def _value(sender: str, item: wire.WireItem, now: float) -> bytes:
    chain = item.path(sender)
    return json.dumps({"key": item.key, "kind": item.kind, "origin": chain[0], "chain": chain,
                       "sender": sender, "payload": item.payload,
                       "created_at": item.created_at, "received_at": now},
                      separators=(",", ":")).encode()


def _stored(entry: Entry) -> StoredResult:
    d = json.loads(entry.value)
    return StoredResult(entry.seq, str(d["key"]), str(d["kind"]), str(d["origin"]),
                        tuple(d["chain"]), str(d["sender"]), d["payload"],
                        float(d["created_at"]), float(d["received_at"]))
