"""Hard examples on etcd: one store for every replica of the control plane.

The :class:`~tierlink.control.store.HardExampleStore` contract on an
:class:`~tierlink.etcd.log.EtcdLog` under ``/tierlink/hard-examples/``: an example's ``id``
is its number in the log (growing, never reused), one re-sent is stored once (its dedupe
key is a digest of what the SQLite store holds unique: node, request, model, row, time),
and at most ``max_rows`` are kept (the oldest go first, keys, tensors and all).

etcd holds the records; the tensors are blobs in the replicas' shared blob store
(``BlobStore`` under ``<repo_dir>/hard-examples``, beside the model repository's). etcd is
made for small, slowly changing data: every byte written goes through its raft log (kept in
its members' memory until a snapshot and thousands of entries after) and its database, and
a 28×28 image in FP32 is ten times its record. Each tensor's blob is its example's own (the
dedupe key, then the bytes: the same input kept twice is two blobs), so an example that
goes takes exactly its blob with it. A blob is written before its record is appended (a
record never names a missing blob; a replica killed in between leaves a blob no record
names), and an entry written inline by an earlier version (record, newline, bytes) is
still read.

Filtered pages read the log in order and keep what matches, so a filter that matches
little reads much: what a retraining export does once, not what a node does every second.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from tierlink.control.schemas import HardExampleIn, HardExampleRecord
from tierlink.control.store import AddResult, StoredExample
from tierlink.errors import ControlPlaneError, RepositoryError
from tierlink.etcd.client import Etcd
from tierlink.etcd.log import Entry, EtcdLog
from tierlink.repo.blobs import BlobStore

log = logging.getLogger("tierlink.control")

DEFAULT_PREFIX = "/tierlink/hard-examples/"
READ_PAGE = 200


class EtcdHardExampleStore:
    """Hard examples in etcd, their tensors in ``blobs`` (see the module). Thread-safe."""

    def __init__(self, etcd: Etcd, blobs: BlobStore, *, prefix: str = DEFAULT_PREFIX,
                 max_rows: int = 50_000) -> None:
        if max_rows < 1:
            raise ControlPlaneError(f"the hard-example row cap must be >= 1, got {max_rows}")
        self.log = EtcdLog(etcd, prefix)
        self.blobs = blobs
        self.max_rows = max_rows

    def add(self, examples: Sequence[HardExampleIn], now: float) -> AddResult:
        entries = []
        for e in examples:
            key = _dedupe_key(e)
            entries.append((key, _record(e, now, self.blobs.put_bytes(_blob(key, e)))))
        numbers = self.log.append(entries)  # a duplicate's blob is the stored one's
        evicted = self.log.trim(self.max_rows, forget_keys=True)
        for entry in evicted:
            self._drop_blob(entry)
        stored = sum(n is not None for n in numbers)
        return AddResult(stored, len(numbers) - stored, len(evicted))

    def page(self, *, model: str | None = None, node: str | None = None, after_id: int = 0,
             limit: int = 100) -> list[HardExampleRecord]:
        return [record for record, _ in self._matching(model, node, after_id, limit, False)]

    def export(self, *, model: str | None = None, node: str | None = None,
               limit: int | None = None) -> list[StoredExample]:
        return [StoredExample(record, data)
                for record, data in self._matching(model, node, 0, limit, True)]

    def count(self) -> int:
        return self.log.count()

    def close(self) -> None:
        """Nothing to close: the etcd client is the caller's."""

    def _matching(self, model: str | None, node: str | None, after_id: int,
                  limit: int | None, tensors: bool
                  ) -> Iterator[tuple[HardExampleRecord, bytes]]:
        """Examples past ``after_id`` that pass the filters, oldest first, at most
        ``limit`` (None: all); with ``tensors``, their bytes (else ``b""``). An example
        whose blob is gone (trimmed by another replica meanwhile, or a blob store the
        replicas do not share) is left out of an export and logged."""
        found, after = 0, after_id
        while limit is None or found < limit:
            entries = self.log.after(after, READ_PAGE)
            for entry in entries:
                record, sha, inline = _parse(entry)
                if (model is not None and record.model != model) or \
                        (node is not None and record.node_id != node):
                    continue
                data = (inline if sha is None else self._tensor(entry, sha)) if tensors \
                    else b""
                if data is None:
                    continue
                yield record, data
                found += 1
                if limit is not None and found >= limit:
                    return
            if len(entries) < READ_PAGE:
                return
            after = entries[-1].seq

    def _tensor(self, entry: Entry, sha: str) -> bytes | None:
        """The example's tensor from its blob (None, logged, when it cannot be read)."""
        try:
            blob = self.blobs.path(sha).read_bytes()
        except (RepositoryError, OSError) as exc:
            log.warning("hard example %d: its tensor is not readable (%s); left out",
                        entry.seq, exc)
            return None
        key = entry.key.encode()
        if not blob.startswith(key):
            log.warning("hard example %d: blob %s is not its own; left out", entry.seq, sha)
            return None
        return blob[len(key):]

    def _drop_blob(self, entry: Entry) -> None:
        sha = _meta(entry)[0].get("blob")  # the record itself is not needed here
        if sha is not None:
            self.blobs.remove(sha)


def _dedupe_key(e: HardExampleIn) -> str:
    """What the SQLite store holds unique, as a digest (a retried batch is stored once)."""
    text = json.dumps([e.node_id, e.request_id, e.model, e.row, e.created_at])
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _blob(key: str, e: HardExampleIn) -> bytes:
    """The example's own blob: its dedupe key, then the tensor's raw bytes."""
    return key.encode() + e.input.raw()


def _record(e: HardExampleIn, now: float, blob: str) -> bytes:
    meta = {"request_id": e.request_id, "row": e.row, "node_id": e.node_id, "model": e.model,
            "task": e.task, "privacy": e.privacy, "prediction": e.prediction,
            "confidence": e.confidence, "threshold": e.threshold, "label": e.label,
            "created_at": e.created_at, "received_at": now, "datatype": e.input.datatype,
            "shape": list(e.input.shape), "blob": blob}
    return json.dumps(meta, separators=(",", ":")).encode()


def _parse(entry: Entry) -> tuple[HardExampleRecord, str | None, bytes]:
    """The record, its tensor's blob (None: an entry written inline by an earlier version)
    and the inline bytes (empty otherwise)."""
    doc, inline = _meta(entry)
    sha = doc.pop("blob", None)
    return HardExampleRecord.model_validate({**doc, "id": entry.seq}), sha, inline


def _meta(entry: Entry) -> tuple[dict[str, Any], bytes]:
    """The entry's record as JSON, and what follows it (the inline tensor, if any)."""
    meta, _, inline = entry.value.partition(b"\n")
    return json.loads(meta), inline
