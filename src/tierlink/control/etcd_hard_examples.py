"""Hard examples on etcd: one store for every replica of the control plane.

The :class:`~tierlink.control.store.HardExampleStore` contract on an
:class:`~tierlink.etcd.log.EtcdLog` under ``/tierlink/hard-examples/``: an example's ``id``
is its number in the log (growing, never reused), one re-sent is stored once (its dedupe
key is a digest of what the SQLite store holds unique: node, request, model, row, time),
and at most ``max_rows`` are kept (the oldest go first, keys and all). An entry is the
record's JSON, a newline and the tensor's raw bytes; an example larger than an etcd entry
takes (about 1 MB) is refused with a reason. Filtered pages read the log in order and keep
what matches, so a filter that matches little reads much: what a retraining export does
once, not what a node does every second.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence

from tierlink.control.schemas import HardExampleIn, HardExampleRecord
from tierlink.control.store import AddResult, StoredExample
from tierlink.errors import ControlPlaneError
from tierlink.etcd.client import Etcd
from tierlink.etcd.log import Entry, EtcdLog

DEFAULT_PREFIX = "/tierlink/hard-examples/"
READ_PAGE = 200


class EtcdHardExampleStore:
    """Hard examples in etcd (see the module). Thread-safe."""

    def __init__(self, etcd: Etcd, *, prefix: str = DEFAULT_PREFIX,
                 max_rows: int = 50_000) -> None:
        if max_rows < 1:
            raise ControlPlaneError(f"the hard-example row cap must be >= 1, got {max_rows}")
        self.log = EtcdLog(etcd, prefix)
        self.max_rows = max_rows

    def add(self, examples: Sequence[HardExampleIn], now: float) -> AddResult:
        numbers = self.log.append([(_dedupe_key(e), _entry(e, now)) for e in examples])
        stored = sum(n is not None for n in numbers)
        evicted = self.log.trim(self.max_rows, forget_keys=True)
        return AddResult(stored, len(numbers) - stored, evicted)

    def page(self, *, model: str | None = None, node: str | None = None, after_id: int = 0,
             limit: int = 100) -> list[HardExampleRecord]:
        return [record for record, _ in self._matching(model, node, after_id, limit)]

    def export(self, *, model: str | None = None, node: str | None = None,
               limit: int | None = None) -> list[StoredExample]:
        return [StoredExample(record, data)
                for record, data in self._matching(model, node, 0, limit)]

    def count(self) -> int:
        return self.log.count()

    def close(self) -> None:
        """Nothing to close: the etcd client is the caller's."""

    def _matching(self, model: str | None, node: str | None, after_id: int,
                  limit: int | None) -> Iterator[tuple[HardExampleRecord, bytes]]:
        """Examples past ``after_id`` that pass the filters, oldest first, at most
        ``limit`` (None: all)."""
        found, after = 0, after_id
        while limit is None or found < limit:
            entries = self.log.after(after, READ_PAGE)
            for entry in entries:
                record, data = _parse(entry)
                if (model is None or record.model == model) and \
                        (node is None or record.node_id == node):
                    yield record, data
                    found += 1
                    if limit is not None and found >= limit:
                        return
            if len(entries) < READ_PAGE:
                return
            after = entries[-1].seq


def _dedupe_key(e: HardExampleIn) -> str:
    """What the SQLite store holds unique, as a digest (a retried batch is stored once)."""
    text = json.dumps([e.node_id, e.request_id, e.model, e.row, e.created_at])
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _entry(e: HardExampleIn, now: float) -> bytes:
    meta = {"request_id": e.request_id, "row": e.row, "node_id": e.node_id, "model": e.model,
            "task": e.task, "privacy": e.privacy, "prediction": e.prediction,
            "confidence": e.confidence, "threshold": e.threshold, "label": e.label,
            "created_at": e.created_at, "received_at": now, "datatype": e.input.datatype,
            "shape": list(e.input.shape)}
    return json.dumps(meta, separators=(",", ":")).encode() + b"\n" + e.input.raw()


def _parse(entry: Entry) -> tuple[HardExampleRecord, bytes]:
    meta, _, data = entry.value.partition(b"\n")
    return HardExampleRecord.model_validate({**json.loads(meta), "id": entry.seq}), data
