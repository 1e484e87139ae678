"""A small etcd v3 client over etcd's JSON gateway (``/v3/*``), on httpx.

etcd 3.4 (Debian's ``etcd-server``) serves its gRPC API as JSON over HTTP on the client
port; keys and values travel as base64. This client speaks the handful of calls the
control plane needs -- put, range, delete, transactions, leases, watches -- and no more,
so it needs neither gRPC nor generated protobuf code.

A client takes every member's URL: a call that cannot reach one member (refused, reset,
timed out) is tried on the next, and the member that answered is asked first next time.
Everything that still fails is an :class:`~tierlink.errors.ControlPlaneError` naming the
members and the call. A client is safe to use from several threads.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import httpx

from tierlink.errors import ControlPlaneError

log = logging.getLogger(__name__)

_HINT = ("start etcd (tierlink up does, for a fleet file with `control: {store: etcd}`) "
         "or pass the client URLs of its running members")


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd holds it."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int = 0
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Event:
    """One change a watch delivers: ``kind`` is ``put`` or ``delete`` (a delete's value is
    empty; a lease's expiry is a delete)."""

    kind: str
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction on ``key``: ``target`` is ``version`` (0: absent),
    ``mod`` (its mod revision) or ``value``."""

    key: str
    target: str
    value: int | bytes
    result: str = "EQUAL"  # EQUAL | NOT_EQUAL | GREATER | LESS


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a transaction: a put (with an optional lease), a delete, or a get
    (read back by :meth:`Etcd.txn_reads`)."""

    kind: str  # put | delete | get
    key: str
    value: bytes = b""
    lease: int = 0


@dataclass
class Etcd:
    """A client of the etcd cluster whose members listen at ``endpoints``."""

    endpoints: Sequence[str]
    timeout_s: float = 2.0
    _http: httpx.Client = field(init=False, repr=False)
    _first: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ControlPlaneError("no etcd endpoints given", hint=_HINT)
        self.endpoints = tuple(e.rstrip("/") for e in self.endpoints)
        self._http = httpx.Client(timeout=self.timeout_s, trust_env=False,
                                  limits=httpx.Limits(max_connections=64,
                                                      max_keepalive_connections=32))

    # -- keys ------------------------------------------------------------------------------

    def put(self, key: str, value: bytes | str, *, lease: int = 0) -> int:
        """Set ``key``; returns the store's revision after the write."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return _revision(self.call("kv/put", body, f"write {key}"))

    def get(self, key: str) -> KeyValue | None:
        """The key's current value, or None."""
        kvs, _ = self._range({"key": _b64(key)}, f"read {key}")
        return kvs[0] if kvs else None

    def prefix(self, prefix: str, *, keys_only: bool = False) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` and the revision they were read at."""
        body: dict[str, Any] = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        if keys_only:
            body["keys_only"] = True
        return self._range(body, f"list {prefix}")

    def delete(self, key: str) -> int:
        """Delete ``key``; returns how many keys went (0 or 1)."""
        answer = self.call("kv/deleterange", {"key": _b64(key)}, f"delete {key}")
        return int(answer.get("deleted", 0))

    def txn(self, compare: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> tuple[bool, int]:
        """Apply ``success`` if every comparison holds, else ``failure``, atomically;
        returns whether the comparisons held and the revision after it."""
        body = {"compare": [_compare(c) for c in compare],
                "success": [_op(o) for o in success],
                "failure": [_op(o) for o in failure]}
        answer = self.call("kv/txn", body, "a transaction")
        return bool(answer.get("succeeded", False)), _revision(answer)

    def txn_reads(self, compare: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = ()) -> tuple[bool, list[KeyValue | None]]:
        """:meth:`txn`, answering whether the comparisons held and what each ``get`` of the
        branch that ran read (None: the key was absent), in order."""
        body = {"compare": [_compare(c) for c in compare],
                "success": [_op(o) for o in success],
                "failure": [_op(o) for o in failure]}
        answer = self.call("kv/txn", body, "a transaction")
        reads: list[KeyValue | None] = []
        for response in answer.get("responses", ()):
            if "response_range" in response:
                kvs = response["response_range"].get("kvs") or ()
                reads.append(_kv(kvs[0]) if kvs else None)
        return bool(answer.get("succeeded", False)), reads

    def scan(self, start: str, end: str, limit: int) -> list[KeyValue]:
        """Keys from ``start`` (included) to ``end`` (excluded) in key order, at most
        ``limit`` of them."""
        body = {"key": _b64(start), "range_end": _b64(end), "limit": str(limit)}
        return self._range(body, f"list from {start}")[0]

    def count(self, prefix: str) -> int:
        """How many keys there are under ``prefix``."""
        answer = self.call("kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)),
                                        "count_only": True}, f"count {prefix}")
        return int(answer.get("count", 0))

    # -- leases ----------------------------------------------------------------------------

    def grant(self, ttl_s: float) -> int:
        """A new lease of ``ttl_s`` (rounded up to whole seconds); its keys go when it
        expires."""
        answer = self.call("lease/grant", {"TTL": max(1, int(-(-ttl_s // 1)))}, "a lease")
        return int(answer["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew a lease; returns its new TTL in seconds, 0 when it had already expired."""
        answer = self.call("lease/keepalive", {"ID": str(lease)}, "a lease renewal")
        return int(answer.get("result", answer).get("TTL", 0))

    def keepalive_many(self, leases: Sequence[int]) -> dict[int, int]:
        """Renew many leases in one call (the gateway streams one answer per lease asked
        in the body); each lease's new TTL, 0 for one that had already run out."""
        if not leases:
            return {}
        body = "\n".join(json.dumps({"ID": str(lease)}) for lease in leases)
        errors = []
        for _ in range(len(self.endpoints)):
            url = f"{self.endpoints[self._first]}/v3/lease/keepalive"
            try:
                response = self._http.post(url, content=body,
                                           headers={"content-type": "application/json"})
            except httpx.HTTPError as exc:
                errors.append(f"{url}: {type(exc).__name__}")
                self._rotate()
                continue
            if response.status_code != 200:
                errors.append(f"{url}: HTTP {response.status_code}")
                self._rotate()
                continue
            ttls = {}
            for line in response.text.splitlines():
                result = json.loads(line).get("result", {}) if line.strip() else {}
                if "ID" in result:
                    ttls[int(result["ID"])] = int(result.get("TTL", 0))
            return {lease: ttls.get(lease, 0) for lease in leases}
        raise ControlPlaneError("etcd could not renew leases: " + "; ".join(errors), hint=_HINT)

    def revoke(self, lease: int) -> None:
        """End a lease now: its keys are deleted. An unknown lease is not an error."""
        try:
            self.call("lease/revoke", {"ID": str(lease)}, "a lease revocation")
        except ControlPlaneError as exc:
            if "not found" not in str(exc):
                raise

    # -- watches ---------------------------------------------------------------------------

    def watch(self, prefix: str, start_revision: int,
              on_events: Callable[[list[Event], int], None], stop: threading.Event,
              on_compacted: Callable[[], int] | None = None) -> None:
        """Deliver every change under ``prefix`` from ``start_revision`` on, in order, to
        ``on_events(events, revision)`` until ``stop`` is set; run it on a thread of its own.

        A broken stream is resumed (on any member) from the revision after the last one
        delivered, so nothing is missed. When etcd has compacted those revisions away,
        ``on_compacted()`` rebuilds the reader's state and returns the revision to go on
        from."""
        revision = start_revision
        while not stop.is_set():
            try:
                for events, rev in self._watch_once(prefix, revision, stop):
                    on_events(events, rev)
                    revision = rev + 1
            except _Compacted:
                if on_compacted is None:
                    raise ControlPlaneError(f"etcd compacted the history of {prefix} past "
                                            f"revision {revision}", hint=_HINT) from None
                revision = on_compacted() + 1
            except (httpx.HTTPError, ControlPlaneError, ValueError) as exc:
                log.debug("etcd watch of %s broke (%s); resuming at %d", prefix, exc, revision)
                self._rotate()
                stop.wait(0.2)

    def _watch_once(self, prefix: str, revision: int, stop: threading.Event
                    ) -> Iterator[tuple[list[Event], int]]:
        body = {"create_request": {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)),
                                   "start_revision": str(revision), "progress_notify": True}}
        url = f"{self.endpoints[self._first]}/v3/watch"
        # A quiet stream times a read out each second: then ``stop`` is checked and the
        # watch is opened again from where it was.
        timeout = httpx.Timeout(self.timeout_s, read=1.0)
        with self._http.stream("POST", url, json=body, timeout=timeout) as response:
            response.raise_for_status()
            try:
                for line in response.iter_lines():
                    if stop.is_set():
                        return
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    if int(result.get("compact_revision", 0) or 0) > 0:
                        raise _Compacted
                    events = [_event(e) for e in result.get("events", ())]
                    if events:
                        yield events, max(e.kv.mod_revision for e in events)
            except httpx.ReadTimeout:
                return

    # -- plumbing --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The answering member's status (its id, the leader, the raft term)."""
        return self.call("maintenance/status", {}, "a status")

    def close(self) -> None:
        self._http.close()

    def _range(self, body: Mapping[str, Any], what: str) -> tuple[list[KeyValue], int]:
        answer = self.call("kv/range", body, what)
        return [_kv(k) for k in answer.get("kvs", ())], _revision(answer)

    def call(self, path: str, body: Mapping[str, Any], what: str) -> dict[str, Any]:
        """POST ``/v3/<path>`` to a member that answers; its JSON answer."""
        errors = []
        for _ in range(len(self.endpoints)):
            url = f"{self.endpoints[self._first]}/v3/{path}"
            try:
                response = self._http.post(url, json=body)
            except httpx.HTTPError as exc:
                errors.append(f"{url}: {type(exc).__name__}")
                self._rotate()
                continue
            answer = _answer(response, url, what)
            if answer is None:  # the member has no leader (a cluster re-electing)
                errors.append(f"{url}: no leader")
                self._rotate()
                continue
            return answer
        raise ControlPlaneError(f"etcd could not {what}: " + "; ".join(errors), hint=_HINT)

    def _rotate(self) -> None:
        with self._lock:
            self._first = (self._first + 1) % len(self.endpoints)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class _Compacted(Exception):
    pass


def prefix_end(prefix: str) -> str:
    """The first key after every key that starts with ``prefix`` (a range's end); prefixes
    are ASCII and do not end in DEL."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def _kv(raw: Mapping[str, Any]) -> KeyValue:
    return KeyValue(key=base64.b64decode(raw.get("key", "")).decode(),
                    value=base64.b64decode(raw.get("value", "")),
                    mod_revision=int(raw.get("mod_revision", 0)),
                    create_revision=int(raw.get("create_revision", 0)),
                    lease=int(raw.get("lease", 0)))


def _event(raw: Mapping[str, Any]) -> Event:
    return Event(kind="delete" if raw.get("type") == "DELETE" else "put", kv=_kv(raw["kv"]))


def _revision(answer: Mapping[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))


def _compare(c: Compare) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(c.key), "result": c.result, "target": c.target.upper()}
    if c.target == "version":
        body["version"] = str(c.value)
    elif c.target == "mod":
        body["mod_revision"] = str(c.value)
    else:
        body["value"] = _b64(c.value if isinstance(c.value, bytes) else str(c.value))
    return body


def _op(o: Op) -> dict[str, Any]:
    if o.kind == "delete":
        return {"request_delete_range": {"key": _b64(o.key)}}
    if o.kind == "get":
        return {"request_range": {"key": _b64(o.key)}}
    put: dict[str, Any] = {"key": _b64(o.key), "value": _b64(o.value)}
    if o.lease:
        put["lease"] = str(o.lease)
    return {"request_put": put}


def _answer(response: httpx.Response, url: str, what: str) -> dict[str, Any] | None:
    """The member's JSON answer; None when it has no leader (try another); an error
    status otherwise is a :class:`ControlPlaneError`."""
    try:
        body = response.json()
    except ValueError as exc:
        raise ControlPlaneError(f"etcd at {url} answered {what} with invalid JSON",
                                hint=_HINT) from exc
    if response.status_code == 200 and isinstance(body, dict):
        return body
    message = str(body.get("error") or body.get("message") or response.text[:200]) \
        if isinstance(body, dict) else response.text[:200]
    if "no leader" in message or "leader changed" in message or response.status_code == 503:
        return None
    raise ControlPlaneError(f"etcd at {url} refused {what}: {message}", hint=_HINT)
