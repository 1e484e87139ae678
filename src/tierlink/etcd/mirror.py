"""Every key under a prefix, kept in memory by a watch: what a stateless control-plane
replica reads on its hot paths (credentials on every call) without asking etcd each time.

Its own writes go in at once (:meth:`Mirror.note`), so a replica reads what it just wrote;
other replicas' writes arrive through the watch, in revision order, within milliseconds.
"""

from __future__ import annotations

import threading
from typing import Self

from tierlink.etcd.client import Etcd, Event, KeyValue


class Mirror:
    """The keys under ``prefix`` (by the rest of their name) as etcd last told us."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = prefix
        self._lock = threading.Lock()
        self._kvs: dict[str, KeyValue] = {}
        self._revision = 0
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> Self:
        revision = self._load()
        self._watcher = threading.Thread(
            target=self.etcd.watch, name=f"mirror{self.prefix}", daemon=True,
            args=(self.prefix, revision + 1, self._apply, self._stop, self._load))
        self._watcher.start()
        return self

    def get(self, name: str) -> KeyValue | None:
        with self._lock:
            return self._kvs.get(name)

    def items(self) -> list[tuple[str, KeyValue]]:
        """Every key, by name."""
        with self._lock:
            return sorted(self._kvs.items())

    @property
    def revision(self) -> int:
        with self._lock:
            return self._revision

    def note(self, kv: KeyValue | None, name: str | None = None) -> None:
        """Our own write of ``kv`` (or delete of ``name``), applied before the watch says so."""
        with self._lock:
            if kv is None:
                if name is not None:
                    self._kvs.pop(name, None)
                return
            key = kv.key[len(self.prefix):]
            current = self._kvs.get(key)
            if current is None or current.mod_revision <= kv.mod_revision:
                self._kvs[key] = kv

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    def _load(self) -> int:
        kvs, revision = self.etcd.prefix(self.prefix)
        with self._lock:
            self._kvs = {kv.key[len(self.prefix):]: kv for kv in kvs}
            self._revision = revision
        return revision

    def _apply(self, events: list[Event], revision: int) -> None:
        with self._lock:
            for event in events:
                name = event.kv.key[len(self.prefix):]
                current = self._kvs.get(name)
                if current is not None and current.mod_revision > event.kv.mod_revision:
                    continue
                if event.kind == "delete":
                    self._kvs.pop(name, None)
                else:
                    self._kvs[name] = event.kv
            self._revision = max(self._revision, revision)
