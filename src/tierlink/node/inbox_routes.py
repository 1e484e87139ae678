"""A node's receiving end of store-and-forward: ``POST /tierlink/v1/inbox``.

A downstream node (a device, for an edge) delivers its outbox here in batches
(:mod:`tierlink.outbox.wire`). Each item is applied once per idempotency key by an
:class:`~tierlink.outbox.Inbox` at ``<state_dir>/inbox.db``; applying it means *relaying*
it: putting it into this node's own :class:`~tierlink.node.uplink.Uplink` toward the
control plane (or toward its parent when it has no control plane), with the sender appended
to the item's ``chain``. The item is acknowledged ``ok`` only after that put has been fsynced,
so it is never lost between hops: until then the sender keeps it.

Answers (``200 {"acks": [...]}``), in item order:

* ``ok``: relayed now; ``duplicate``: relayed before (the sender lost an ack);
* ``rejected`` with ``replayed: ...``: the key was relayed before *for another sender* —
  a captured item sent again by someone else (TLS fleets know the sender; counted in
  ``tierlink_peer_refusals_total{reason="replayed"}``);
* ``rejected``: an item with a key that cannot be accepted (bad kind, no payload, a key
  waiting here for another kind): the sender drops it and counts it;
* ``retry``: this node's outbox refused the item (full, disk failing) — for it and every
  later item of the batch, so the sender's order holds.

A batch that cannot be read (not JSON, no ``from``, an item without a key, ...) is a ``400``
naming the field, and nothing of it is applied.

On a node with TLS only nodes deliver (a fleet certificate of role ``node``), and a batch's
``from`` must be the node that sends it (else ``403 peer_refused``, ``forged_origin``).

Crash safety: the relay is an effect on another database (the outbox), so the inbox records
the key just *after* the put (:meth:`Inbox.apply`). A crash between the two leaves the key
unrecorded; the redelivered item is put again, which stores nothing while the first copy
waits, and is answered ``duplicate`` by the control plane if the first copy was already
delivered. The effect at the end is once either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

# The web adapter: importing it means serving, so fastapi is imported here.
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from tierlink.errors import InvalidRequest, OutboxError, PeerRefused, TierlinkError
from tierlink.node.peers import PeerGuard
from tierlink.node.uplink import INBOX_PATH, Uplink
from tierlink.outbox import Ack, AckStatus, Inbox, wire
from tierlink.transport.openapi import request_body

log = logging.getLogger("tierlink.node.inbox")

INBOX_FILE = "inbox.db"
MAX_BODY_BYTES = 64 * 2**20


class _Refused(Exception):
    """An item that cannot be relayed, ever (answered ``rejected``)."""


class InboxReceiver:
    """Dedupes and relays received items (see the module doc). :meth:`receive` blocks on
    SQLite fsyncs: call it off the event loop (the route does)."""

    def __init__(self, inbox: Inbox, uplink: Uplink, *, relay_to: str | None = None) -> None:
        self.inbox = inbox
        self.uplink = uplink
        self.on_replay: Callable[[str], None] = lambda _sender: None
        # An edge relays to the control plane directly; without one, up its own chain.
        self.relay_to = relay_to or uplink.destinations[-1]

    @classmethod
    def open(cls, state_dir: str | Path, uplink: Uplink, *,
             relay_to: str | None = None) -> InboxReceiver:
        """A receiver whose inbox lives at ``<state_dir>/inbox.db``."""
        return cls(Inbox(Path(state_dir) / INBOX_FILE), uplink, relay_to=relay_to)

    def receive(self, body: bytes, sender: str | None = None) -> list[Ack]:
        """Apply one batch (the raw request body); its acks in item order. Raises
        :class:`InvalidRequest` for a batch that cannot be read (nothing applied), and
        :class:`PeerRefused` when ``sender`` (the authenticated one) is not the batch's."""
        batch = wire.parse_batch(body)
        if sender is not None and batch.sender != sender:
            raise PeerRefused(f"node {sender} delivered a batch from {batch.sender!r}",
                              reason="forged_origin")
        acks: list[Ack] = []
        for entry in batch.entries:
            if acks and acks[-1].status is AckStatus.RETRY:
                acks.append(Ack(entry.key, AckStatus.RETRY, "an earlier item must go first"))
            elif isinstance(entry, wire.Rejected):
                acks.append(Ack(entry.key, AckStatus.REJECTED, entry.detail))
            else:
                acks.append(self._apply(batch.sender, entry))
        self._count(acks)
        return acks

    def close(self) -> None:
        self.inbox.close()

    def _apply(self, sender: str, item: wire.WireItem) -> Ack:
        try:
            result, duplicate = self.inbox.apply(item.key, lambda: self._relay(sender, item))
        except _Refused as exc:
            return Ack(item.key, AckStatus.REJECTED, str(exc))
        except OutboxError as exc:  # full or failing: the sender keeps it and retries
            return Ack(item.key, AckStatus.RETRY, exc.message)
        first = _relayed_for(result)
        if duplicate and first is not None and first != sender:
            self.on_replay(sender)
            return Ack(item.key, AckStatus.REJECTED,
                       f"replayed: key {item.key} was delivered by {first}, not {sender}")
        return Ack(item.key, AckStatus.DUPLICATE if duplicate else AckStatus.OK)

    def _relay(self, sender: str, item: wire.WireItem) -> bytes:
        waiting = self.uplink.outbox.get(item.key)
        if waiting is not None and (waiting.kind, waiting.destination) != \
                (item.kind, self.relay_to):  # a key reused for something else
            raise _Refused(f"key {item.key} is waiting here as a {waiting.kind!r} item; "
                           "use a fresh key for a different item")
        # At most what it had left at the sender: its life is its origin's TTL.
        ttl = None if item.ttl_s is None else min(item.ttl_s, self.uplink.outbox.default_ttl_s)
        self.uplink.enqueue(item.kind, item.key, item.payload, self.relay_to,
                            chain=item.path(sender), created_at=item.created_at, ttl_s=ttl)
        return _RELAYED + sender.encode()

    def _count(self, acks: Sequence[Ack]) -> None:
        if self.uplink.metrics is None:
            return
        for status, n in Counter(a.status.value for a in acks).items():
            self.uplink.metrics.on_received(status, n)


_RELAYED = b"relayed for "  # + the sender: what the inbox keeps per key


def _relayed_for(result: bytes) -> str | None:
    """Who a key was first relayed for (None: a key kept before senders were recorded)."""
    return result[len(_RELAYED):].decode() if result.startswith(_RELAYED) else None


def install_inbox_routes(app: FastAPI, receiver: InboxReceiver,
                         guard: PeerGuard | None = None) -> None:
    """Add ``POST /tierlink/v1/inbox`` to a node's ``app``; keeps ``receiver`` on
    ``app.state.inbox``. Errors are answered here as ``{"error", "code", "hint"}`` JSON, so
    the route needs no handler of the app's."""
    app.state.inbox = receiver
    if guard is not None:
        def replayed(sender: str) -> None:
            guard.refuse("replayed", f"an inbox item replayed by {sender}")  # counted

        receiver.on_replay = replayed

    @app.post(INBOX_PATH, openapi_extra=request_body(wire.BATCH_SCHEMA))
    async def inbox(request: Request) -> Response:
        try:
            peer = None if guard is None else guard.require(request.scope, "the inbox")
            body = await _body(request)
            acks = await asyncio.to_thread(receiver.receive, body,
                                           None if peer is None else peer.name)
        except PeerRefused as exc:
            if guard is not None and exc.details.get("reason") == "forged_origin":
                guard.refuse("forged_origin", exc.message)  # counted; the answer is exc's
            log.warning("inbox: %s", exc)
            return JSONResponse(exc.to_dict(), status_code=exc.http_status)
        except TierlinkError as exc:
            log.warning("inbox: %s", exc)
            return JSONResponse(exc.to_dict(), status_code=exc.http_status)
        receiver.uplink.kick(receiver.relay_to)
        return JSONResponse(wire.encode_acks(acks))


async def _body(request: Request) -> bytes:
    from tierlink.transport.bodies import read_bounded

    return await read_bounded(request, MAX_BODY_BYTES, _too_large)


def _too_large(size: int) -> InvalidRequest:
    return InvalidRequest(f"invalid outbox batch: {size} bytes, more than the "
                          f"{MAX_BODY_BYTES} allowed", hint="send smaller batches")


__all__ = ["INBOX_FILE", "InboxReceiver", "install_inbox_routes"]
