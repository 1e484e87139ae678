"""An append-only log in etcd that stores each entry once: what replicas of the control
plane share of delivered results and hard examples.

Entries are numbered 1, 2, 3, ... in the order they were appended, by every replica
together; each is appended under a *dedupe key* (an idempotency key, a digest of what makes
an example the same), and a key already in the log makes its append a duplicate. Numbers
are never reused, so pages read ``after`` a number stay stable while the front is trimmed.

Layout under ``prefix``::

    next              the last number handed out (decimal)
    seq/<20 digits>   an entry: its dedupe key (a JSON string), a newline, its value
    key/<dedupe key>  the entry's number ("0": a key remembered without an entry)

An append is one transaction per chunk (at most ``MAX_OPS`` operations and
``MAX_BYTES`` of values, under etcd's default limits) that holds only if ``next`` is
unchanged since it was read and none of its dedupe keys exists; when it does not hold, the
same transaction reads them back, the duplicates leave the chunk and the rest is tried
again. Replicas appending at once therefore take turns, and a retried append (a replica
that timed out after etcd applied it) finds its keys and writes nothing twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tierlink.errors import ControlPlaneError, InvalidRequest
from tierlink.etcd.client import Compare, Etcd, KeyValue, Op, prefix_end

MAX_OPS = 120  # etcd's default --max-txn-ops is 128
MAX_BYTES = 1_000_000  # of values per transaction; etcd's default request limit is 1.5 MiB
MAX_TRIES = 50
_DIGITS = 20


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry as read back."""

    seq: int
    key: str
    value: bytes


class EtcdLog:
    """The log under ``prefix`` (see the module). Thread-safe (etcd orders the writers)."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = prefix
        self._next = prefix + "next"
        self._seq = prefix + "seq/"
        self._key = prefix + "key/"

    def append(self, entries: Sequence[tuple[str, bytes]], *, lease: int = 0
               ) -> list[int | None]:
        """Append ``(dedupe key, value)`` pairs in order; each one's number, None for a
        duplicate (a key already in the log, or earlier in ``entries``). ``lease``: the
        entries and their keys go when it expires. Raises
        :class:`~tierlink.errors.InvalidRequest` for a value too large for etcd."""
        numbers: dict[str, int | None] = {}
        fresh: list[tuple[str, bytes]] = []
        for key, value in entries:
            if key in numbers:
                continue
            numbers[key] = None
            fresh.append((key, value))
        for chunk in _chunks(fresh):
            numbers.update(self._append_chunk(chunk, lease))
        seen: set[str] = set()
        answer: list[int | None] = []
        for key, _ in entries:
            answer.append(None if key in seen else numbers[key])
            seen.add(key)
        return answer

    def remember(self, key: str, *, lease: int = 0) -> bool:
        """Note ``key`` without an entry (a delivered item handed elsewhere); False when
        the log already had it."""
        held, _ = self.etcd.txn([Compare(self._key + key, "version", 0)],
                                [Op("put", self._key + key, b"0", lease)])
        return held

    def holds(self, key: str) -> bool:
        """Whether ``key`` was appended or remembered (and has not expired)."""
        return self.etcd.get(self._key + key) is not None

    def find(self, key: str) -> Entry | None:
        """The entry appended under ``key``; None for an unknown or remembered key."""
        marker = self.etcd.get(self._key + key)
        if marker is None or marker.value == b"0":
            return None
        kv = self.etcd.get(self._seq + marker.value.decode().zfill(_DIGITS))
        return None if kv is None else _entry(kv, len(self._seq))

    def after(self, seq: int, limit: int) -> list[Entry]:
        """Up to ``limit`` entries numbered above ``seq``, in order."""
        kvs = self.etcd.scan(self._seq + str(seq + 1).zfill(_DIGITS), prefix_end(self._seq),
                             limit)
        return [_entry(kv, len(self._seq)) for kv in kvs]

    def count(self) -> int:
        """Entries in the log now."""
        return self.etcd.count(self._seq)

    def trim(self, keep: int, *, forget_keys: bool) -> list[Entry]:
        """Delete the oldest entries beyond the newest ``keep``; the entries that went.
        ``forget_keys``: their dedupe keys go too (the same content may come again);
        otherwise a replay of a trimmed entry stays a duplicate until its lease ends."""
        excess = self.count() - keep
        trimmed: list[Entry] = []
        while excess > 0:
            oldest = self.after(0, min(excess, MAX_OPS // 2))
            if not oldest:
                break
            ops = [Op("delete", self._seq + str(e.seq).zfill(_DIGITS)) for e in oldest]
            if forget_keys:
                ops += [Op("delete", self._key + e.key) for e in oldest]
            self.etcd.txn([], ops)
            trimmed += oldest
            excess -= len(oldest)
        return trimmed

    def _append_chunk(self, chunk: list[tuple[str, bytes]], lease: int
                      ) -> dict[str, int | None]:
        """One chunk: a transaction, tried again without the duplicates it finds."""
        done: dict[str, int | None] = {}
        current = self.etcd.get(self._next)
        for _ in range(MAX_TRIES):
            if not chunk:
                return done
            last = 0 if current is None else int(current.value)
            guard = Compare(self._next, "version", 0) if current is None else \
                Compare(self._next, "mod", current.mod_revision)
            held, reads = self.etcd.txn_reads(
                [guard, *(Compare(self._key + key, "version", 0) for key, _ in chunk)],
                self._writes(chunk, last, lease),
                [Op("get", self._next), *(Op("get", self._key + key) for key, _ in chunk)])
            if held:
                done.update({key: last + i for i, (key, _) in enumerate(chunk, 1)})
                return done
            current, markers = reads[0], reads[1:]
            for (key, _), marker in zip(chunk, markers, strict=True):
                if marker is not None:
                    done[key] = None
            chunk = [(key, value) for key, value in chunk if key not in done]
        raise ControlPlaneError(
            f"etcd log {self.prefix}: {MAX_TRIES} appends in a row lost to other writers",
            hint="too many control-plane replicas are appending at once; retry")

    def _writes(self, chunk: list[tuple[str, bytes]], last: int, lease: int) -> list[Op]:
        ops = [Op("put", self._next, str(last + len(chunk)).encode())]
        for i, (key, value) in enumerate(chunk, 1):
            number = str(last + i)
            ops.append(Op("put", self._seq + number.zfill(_DIGITS),
                          json.dumps(key).encode() + b"\n" + value, lease))
            ops.append(Op("put", self._key + key, number.encode(), lease))
        return ops


def _chunks(entries: list[tuple[str, bytes]]) -> list[list[tuple[str, bytes]]]:
    """Consecutive runs that fit one transaction each."""
    chunks: list[list[tuple[str, bytes]]] = []
    size = 0
    for key, value in entries:
        if len(value) + len(key) > MAX_BYTES:
            raise InvalidRequest(
                f"an entry of {len(value):,} bytes is larger than the etcd store takes "
                f"({MAX_BYTES:,} bytes per entry)",
                hint="send smaller inputs, or run the control plane on SQLite")
        if not chunks or 1 + 2 * (len(chunks[-1]) + 1) > MAX_OPS or \
                size + len(value) > MAX_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append((key, value))
        size += len(value) + len(key)
    return chunks


def _entry(kv: KeyValue, skip: int) -> Entry:
    key, _, value = kv.value.partition(b"\n")  # a JSON string holds no raw newline
    return Entry(int(kv.key[skip:]), json.loads(key), value)
