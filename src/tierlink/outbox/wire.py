"""The store-and-forward wire format: a batch of outbox items over HTTP, answered per item.

One format for every hop (device -> edge ``POST /tierlink/v1/inbox``, node -> control plane
``POST /v1/results``)::

    request   {"from": "dev-1",
               "items": [{"key": "dev-1:42", "kind": "result", "payload": {...},
                          "created_at": 1733140000.5, "chain": [], "ttl_s": 86390.2},
                         ...]}
    answer    200 {"acks": [{"key": "dev-1:42", "status": "ok", "detail": ""}, ...]}

* ``from``: the node sending this batch (one hop). ``chain``: the nodes the item passed
  through *before* ``from``, oldest first (a device's result relayed by its edge arrives at
  the control plane with ``from: "edge-1"``, ``chain: ["dev-1"]``); so the full path of an
  item is ``chain + [from]`` and its origin is the path's first node.
* ``key``: the idempotency key; the receiver applies each key once (an
  :class:`~tierlink.outbox.inbox.Inbox`) and answers a repeat ``duplicate``.
* ``payload``: any JSON value, the item's content; ``created_at``: epoch seconds at the
  origin (kept across relays).
* ``ttl_s`` (optional): the seconds the item had left at the sender when it sent the batch.
  A relay keeps the item for at most that long (and at most its own TTL), so an item's life
  is its origin's TTL however many hops it takes; relative, so the nodes' clocks need not
  agree. Without it a relay uses its own TTL.
* ``status`` (see :class:`~tierlink.outbox.delivery.AckStatus`): ``ok``, ``duplicate``,
  ``rejected`` (never accepted: the sender drops it), ``retry`` (transient, in order).

How a receiver reads a batch (:func:`parse_batch`):

* a batch it cannot read at all (not JSON, not an object, no ``from``, ``items`` not a list,
  an item that is not an object or has no usable ``key``) raises
  :class:`~tierlink.errors.InvalidRequest`: answer 400 and apply **nothing** of it;
* an item it can identify by key but not accept (bad ``kind``, no ``payload``, bad
  ``created_at``, ``chain`` or ``ttl_s``, or ``ttl_s`` spent in transit) becomes a :class:`Rejected` entry: answer ``rejected`` for it
  and apply the others.

The outbox row of an item (:func:`pack` / :func:`encode_batch`) is its JSON *envelope*
``{"payload", "created_at", "chain"}``; key and kind are columns of the row.

Standard library only; nothing happens at import.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tierlink.errors import InvalidRequest, UpstreamError
from tierlink.outbox.delivery import Ack, AckStatus
from tierlink.outbox.store import Item

MAX_BATCH_ITEMS = 1000
MAX_KEY_CHARS = 256
MAX_CHAIN = 16  # hops an item may have passed through: a loop guard, far above any fleet
KIND_PATTERN = re.compile(r"[a-z][a-z0-9_.-]{0,63}")  # bounded: kinds are metric labels
BATCH_HINT = ('send {"from": NODE_ID, "items": [{"key", "kind", "payload", "created_at", '
              '"chain"?}, ...]} as JSON (see tierlink.outbox.wire)')
# A batch as JSON Schema, for the OpenAPI documents of the routes that take one.
BATCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["from", "items"],
    "properties": {
        "from": {"type": "string", "minLength": 1, "description": "the node sending it"},
        "items": {"type": "array", "maxItems": MAX_BATCH_ITEMS, "items": {
            "type": "object",
            "required": ["key", "kind", "payload", "created_at"],
            "properties": {
                "key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS},
                "kind": {"type": "string", "pattern": f"^{KIND_PATTERN.pattern}$"},
                "payload": {"description": "any JSON value"},
                "created_at": {"type": "number", "minimum": 0},
                "chain": {"type": "array", "maxItems": MAX_CHAIN, "items": {"type": "string"}},
                "ttl_s": {"type": "number", "exclusiveMinimum": 0},
            }}},
    },
}


@dataclass(frozen=True, slots=True)
class WireItem:
    """One readable item of a received batch."""

    key: str
    kind: str
    payload: Any  # JSON value
    created_at: float  # epoch s at the origin
    chain: tuple[str, ...] = ()  # nodes before the batch's sender, oldest first
    ttl_s: float | None = None  # seconds it had left at the sender; None: not said

    def path(self, sender: str) -> tuple[str, ...]:
        """Every node the item passed through, its origin first."""
        return (*self.chain, sender)


@dataclass(frozen=True, slots=True)
class Rejected:
    """An item of a received batch that has a key but cannot be accepted."""

    key: str
    detail: str


@dataclass(frozen=True, slots=True)
class Batch:
    sender: str  # the batch's ``from``
    entries: tuple[WireItem | Rejected, ...] = field(default_factory=tuple)


# ---- sender side -----------------------------------------------------------------------


def pack(payload: Any, created_at: float, chain: Sequence[str] = ()) -> bytes:
    """The outbox row's payload for an item: its JSON envelope. Raises TypeError/ValueError
    when ``payload`` is not JSON-serialisable (NaN included), before anything is stored."""
    return json.dumps({"payload": payload, "created_at": created_at, "chain": list(chain)},
                      separators=(",", ":"), allow_nan=False).encode()


def encode_batch(sender: str, items: Sequence[Item], now: float) -> bytes:
    """The request body for outbox ``items`` (rows whose payload is a :func:`pack` envelope),
    each with the ``ttl_s`` it has left at ``now`` (epoch s, the sender's clock)."""
    wire = [{"key": item.key, "kind": item.kind, **json.loads(item.payload),
             "ttl_s": round(item.expires_at - now, 3)} for item in items]
    return json.dumps({"from": sender, "items": wire}, separators=(",", ":")).encode()


def decode_acks(body: bytes, where: str) -> list[Ack]:
    """The acks of an answer; :class:`UpstreamError` (transient for the deliverer) when the
    answer is not an ack list. Unknown statuses count as ``retry``: nothing is dropped on an
    answer this sender does not understand."""
    try:
        raw = json.loads(body)["acks"]
        return [Ack(str(a["key"]), _status(a.get("status")), str(a.get("detail") or ""))
                for a in raw]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UpstreamError(f"{where} answered something that is not an ack list: "
                            f"{type(exc).__name__}: {exc}",
                            hint="is the receiver a tierlink node or control plane?") from None


def _status(value: Any) -> AckStatus:
    try:
        return AckStatus(value)
    except ValueError:
        return AckStatus.RETRY


# ---- receiver side ---------------------------------------------------------------------


def encode_acks(acks: Sequence[Ack]) -> dict[str, Any]:
    return {"acks": [{"key": a.key, "status": a.status.value, "detail": a.detail}
                     for a in acks]}


def parse_batch(body: bytes) -> Batch:
    """Read a received batch (see the module doc): :class:`InvalidRequest` for a batch that
    cannot be read at all, :class:`Rejected` entries for items that cannot be accepted."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise _invalid(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _invalid(f"the body is a JSON {type(data).__name__}, not an object")
    sender = data.get("from")
    if not isinstance(sender, str) or not sender or len(sender) > MAX_KEY_CHARS:
        raise _invalid(f"from: expected the sending node's id (a non-empty string), got "
                       f"{_short(sender)}")
    items = data.get("items")
    if not isinstance(items, list):
        raise _invalid(f"items: expected a list of items, got {_short(items)}")
    if len(items) > MAX_BATCH_ITEMS:
        raise _invalid(f"items: {len(items)} items; at most {MAX_BATCH_ITEMS} per batch")
    return Batch(sender, tuple(_entry(i, raw) for i, raw in enumerate(items)))


def _entry(index: int, raw: Any) -> WireItem | Rejected:
    if not isinstance(raw, dict):
        raise _invalid(f"items[{index}]: expected an object, got {_short(raw)}")
    key = raw.get("key")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise _invalid(f"items[{index}].key: expected a non-empty string of at most "
                       f"{MAX_KEY_CHARS} characters (the idempotency key), got {_short(key)}")
    problem = _item_problem(raw)
    if problem is not None:
        return Rejected(key, f"items[{index}].{problem}")
    ttl = raw.get("ttl_s")
    return WireItem(key, raw["kind"], raw["payload"], float(raw["created_at"]),
                    tuple(raw.get("chain") or ()), None if ttl is None else float(ttl))


def _item_problem(raw: Mapping[str, Any]) -> str | None:
    """What makes an identified item unacceptable; None when it is fine."""
    kind = raw.get("kind")
    if not isinstance(kind, str) or not KIND_PATTERN.fullmatch(kind):
        return (f"kind: expected a lower-case name like 'result' (letters, digits, _ . -, "
                f"at most 64), got {_short(kind)}")
    if "payload" not in raw:
        return "payload: missing"
    created = raw.get("created_at")
    if isinstance(created, bool) or not isinstance(created, int | float) \
            or not math.isfinite(created):
        return f"created_at: expected epoch seconds (a number), got {_short(created)}"
    chain = raw.get("chain", [])
    if not isinstance(chain, list) or len(chain) > MAX_CHAIN or \
            not all(isinstance(n, str) and n for n in chain):
        return (f"chain: expected a list of at most {MAX_CHAIN} node ids, got "
                f"{_short(chain)}")
    ttl = raw.get("ttl_s")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)
                            or not math.isfinite(ttl)):
        return f"ttl_s: expected the seconds the item has left (a number), got {_short(ttl)}"
    if ttl is not None and ttl <= 0:
        return f"ttl_s: the item expired before it arrived ({ttl} s left at the sender)"
    return None


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(f"invalid outbox batch: {message}", hint=BATCH_HINT)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
