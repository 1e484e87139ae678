"""Store-and-forward: a durable outbox on the sender, a dedupe inbox on the receiver.

* :mod:`~tierlink.outbox.store` — :class:`Outbox`: SQLite (WAL) items with idempotency keys,
  per-destination order, TTL, bounded size with a per-kind full policy; survives kill -9.
* :mod:`~tierlink.outbox.delivery` — :class:`Deliverer`: one asyncio loop per destination,
  batches in order, backoff with jitter on transient failures, drops permanent rejections.
* :mod:`~tierlink.outbox.inbox` — :class:`Inbox`: the receiver applies each key once and
  answers repeats with the original answer, so the effect is exactly once.

Everything here is standard library only; importing it does no I/O.
"""

from __future__ import annotations

from tierlink.outbox.delivery import Ack, AckStatus, Backoff, Deliverer, Round, Sender
from tierlink.outbox.inbox import Inbox
from tierlink.outbox.observer import NullObserver, OutboxObserver
from tierlink.outbox.store import Counts, FullPolicy, Item, Outbox, OutboxStats

__all__ = ["Ack", "AckStatus", "Backoff", "Counts", "Deliverer", "FullPolicy", "Inbox", "Item",
           "NullObserver", "Outbox", "OutboxObserver", "OutboxStats", "Round", "Sender"]
