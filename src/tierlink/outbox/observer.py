"""What the outbox reports for metrics: a small observer protocol and a no-op default.

The store reports every item it drops (it is the only place items are dropped); the
deliverer reports deliveries and retries. Pass the same observer to both. The node maps it
onto Prometheus series, e.g. ``tierlink_outbox_delivered_total{destination,kind}``,
``tierlink_outbox_dropped_total{reason}``, ``tierlink_outbox_retries_total{destination}``;
``tierlink_outbox_items{tier,destination}`` is read from :meth:`Outbox.stats` at scrape time.

Drop reasons: ``full`` (evicted by the ``drop_oldest`` policy to make room), ``expired``
(past its TTL, never delivered), ``rejected`` (the receiver refused it permanently),
``refused`` (a ``put`` refused because the outbox was full: never accepted, the caller got
:class:`~tierlink.errors.OutboxError`).

Callbacks run synchronously, under the store's lock for drops: keep them cheap (increment a
counter) and never call back into the outbox from them.
"""

from __future__ import annotations

from typing import Protocol

DROP_REASONS = ("full", "expired", "rejected", "refused")


class OutboxObserver(Protocol):
    def on_delivered(self, destination: str, kind: str, n: int) -> None:
        """``n`` items of ``kind`` were acknowledged by ``destination`` (ok or duplicate)."""

    def on_dropped(self, reason: str, n: int) -> None:
        """``n`` items left the outbox undelivered, or were never accepted (see module doc)."""

    def on_retry(self, destination: str) -> None:
        """A send to ``destination`` failed transiently; its head item waits for backoff."""


class NullObserver:
    """Reports nothing."""

    def on_delivered(self, destination: str, kind: str, n: int) -> None:
        pass

    def on_dropped(self, reason: str, n: int) -> None:
        pass

    def on_retry(self, destination: str) -> None:
        pass
