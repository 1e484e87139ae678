"""Delivery of outbox items: one asyncio loop per destination, in order, with backoff.

Each destination's loop repeats one *round* (:meth:`Deliverer.deliver_once`): expire items
past their TTL, take the head of the line (:meth:`Outbox.due`, at most ``batch`` items in id
order), ``await send(destination, items)``, then settle the acks **in item order**:

* ``ok`` / ``duplicate``: delivered, removed (a duplicate means an earlier send was applied
  but its ack was lost; the receiver's inbox answered it again);
* ``rejected``: the receiver will never accept it (e.g. a 4xx for a malformed item): dropped
  and counted (reason ``rejected``), delivery continues with the next item;
* ``retry``, a missing ack, or ``send`` raising: a transient failure. The first such item
  becomes the head; it is failed with an exponential backoff delay (with jitter) and the
  whole destination waits until then (head of line: nothing overtakes it). Items after it
  in the batch stay waiting, whatever their acks said; they are sent again after it, and the
  receiver answers those it already applied as duplicates.

Ordering contract for receivers: apply a batch in order and stop at the first item that
fails transiently (answer ``retry`` for it and every later item). Then no item is applied
before an earlier item of the same destination was applied, rejected or expired.

The loops sleep when nothing is due: until the head's retry time, or until :meth:`kick`
(call it after :meth:`Outbox.put`). Backoff attempts are the head item's persisted
``attempts``, so a restarted node keeps backing off where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tierlink.errors import TierlinkError
from tierlink.outbox.observer import NullObserver, OutboxObserver
from tierlink.outbox.store import Item, Outbox
from tierlink.telemetry import tracing

log = logging.getLogger("tierlink.outbox.delivery")

Sleep = Callable[[float], Awaitable[None]]


class AckStatus(str, enum.Enum):
    OK = "ok"
    DUPLICATE = "duplicate"  # applied before: as good as ok
    REJECTED = "rejected"  # permanent: will never be accepted, drop it
    RETRY = "retry"  # transient: try again later, in order


@dataclass(frozen=True, slots=True)
class Ack:
    """The receiver's answer for one item, matched to it by idempotency key."""

    key: str
    status: AckStatus
    detail: str = ""  # why (rejected / retry), for logs and ``last_error``

    @property
    def delivered(self) -> bool:
        return self.status in (AckStatus.OK, AckStatus.DUPLICATE)


class Sender(Protocol):
    """Sends one batch to a destination: ``await send(destination, items)``.

    Called by the destination's loop, one batch at a time per destination, items in id
    order. Returns one :class:`Ack` per item it has an answer for (a missing ack counts as
    ``retry``). Raising (connection refused, timeout, 5xx) means the whole batch failed
    transiently. It should bound its own time (an HTTP timeout): a hung send holds the line.
    """

    async def __call__(self, destination: str, items: Sequence[Item]) -> Sequence[Ack]: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry ``attempt`` (1, 2, ...): ``base_s * 2**(attempt-1)``, at most
    ``max_s``, times a uniform factor in ``[1 - jitter, 1 + jitter]``."""

    base_s: float = 0.2
    max_s: float = 10.0
    jitter: float = 0.2

    def delay(self, attempt: int, rng: random.Random) -> float:
        raw = min(self.max_s, self.base_s * 2.0 ** min(max(attempt, 1) - 1, 60))
        return raw * (1.0 + self.jitter * rng.uniform(-1.0, 1.0))


@dataclass(frozen=True, slots=True)
class Round:
    """What one delivery round of a destination did."""

    sent: int = 0  # items handed to ``send``
    delivered: int = 0
    rejected: int = 0
    expired: int = 0  # by the TTL sweep at the start of the round (all destinations)
    retry_at: float | None = None  # set when the head failed: not retried before this


@dataclass
class _Lane:
    destination: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Deliverer:
    """Delivers an :class:`Outbox` through ``send`` (see module doc).

    ``start()``, ``kick()`` and ``stop()`` are called on the event loop (from another thread:
    ``loop.call_soon_threadsafe(deliverer.kick, destination)``). ``clock`` is the outbox's
    wall clock; ``sleep`` and ``rng`` are injected so tests drive time.
    """

    def __init__(self, outbox: Outbox, send: Sender, *, clock: Callable[[], float] = time.time,
                 sleep: Sleep = asyncio.sleep, rng: random.Random | None = None,
                 backoff: Backoff | None = None, batch: int = 32,
                 observer: OutboxObserver | None = None) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.outbox, self._send = outbox, send
        self._clock, self._sleep = clock, sleep
        self._rng = rng or random.Random()
        self.backoff = backoff or Backoff()
        self.batch = batch
        self._observer: OutboxObserver = observer or NullObserver()
        self._lanes: dict[str, _Lane] = {}
        self._failing: set[str] = set()  # destinations in an outage, to log it once
        self._running = False

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start a loop for every destination with items waiting. Call on a running loop."""
        self._running = True
        self.kick()

    def kick(self, destination: str | None = None) -> None:
        """Wake ``destination``'s loop (starting it if new), e.g. after a put; with no
        destination, wake all and start loops for destinations found in the outbox. A no-op
        before :meth:`start` (which finds whatever waits) and after :meth:`stop`."""
        if not self._running:
            return
        names = [destination] if destination is not None else \
            sorted(set(self._lanes) | set(self.outbox.destinations()))
        for name in names:
            self._lane(name).wake.set()

    async def stop(self) -> None:
        """Stop every loop. A batch in flight is abandoned: its items stay in the outbox and
        are sent again later (the receiver dedupes)."""
        self._running = False
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._lanes.clear()

    # ---- one round -----------------------------------------------------------------------

    async def deliver_once(self, destination: str) -> Round:
        """Expire, take the due head of ``destination``'s line, send it, settle the acks.
        The loops call it; tests drive it directly with a fake clock. (The TTL sweep is for
        all destinations: an item that expires while its batch is in flight is counted as
        expired even if the receiver applied it; its ack then removes nothing.)"""
        expired = self.outbox.expire(self._clock())
        items = self.outbox.due(destination, self._clock(), self.batch)
        if not items:
            return Round(expired=expired)
        with tracing.span("tierlink.outbox.forward", None, {
                "tierlink.destination": destination, "tierlink.items": len(items),
                "tierlink.keys": [item.key for item in items[:50]]}) as span:
            try:
                acks: Sequence[Ack] = await self._send(destination, items)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of a send is transient: retry in order
                if not isinstance(exc, OSError | TimeoutError | TierlinkError):
                    log.exception("outbox send to %s raised unexpectedly", destination)
                acks = []
                error = f"{type(exc).__name__}: {exc}"
                tracing.error(span, error)
            else:
                error = "no ack for this item"
            done = self._settle(destination, items, acks, error, expired)
            tracing.set_attributes(span, {"tierlink.delivered": done.delivered,
                                          "tierlink.rejected": done.rejected})
            return done

    def _settle(self, destination: str, items: Sequence[Item], acks: Sequence[Ack],
                error: str, expired: int) -> Round:
        by_key = {ack.key: ack for ack in acks}
        delivered: list[Item] = []
        rejected: list[Item] = []
        retry_at = None
        for item in items:
            ack = by_key.get(item.key)
            if ack is None or ack.status is AckStatus.RETRY:
                retry_at = self._retry(destination, item, ack.detail if ack else error)
                break
            (delivered if ack.delivered else rejected).append(item)
            if not ack.delivered:
                log.warning("%s rejected outbox item %s (%s): %s; dropped", destination,
                            item.key, item.kind, ack.detail or "no reason given")
        self.outbox.ack([item.id for item in delivered])
        self.outbox.drop([item.id for item in rejected], "rejected")
        self._report_delivered(destination, delivered)
        if retry_at is None:
            self._recovered(destination)
        return Round(sent=len(items), delivered=len(delivered), rejected=len(rejected),
                     expired=expired, retry_at=retry_at)

    def _retry(self, destination: str, item: Item, error: str) -> float:
        retry_at = self._clock() + self.backoff.delay(item.attempts + 1, self._rng)
        self.outbox.fail(item.id, error, retry_at)
        self._observer.on_retry(destination)
        if destination not in self._failing:  # log once per outage, not per retry
            self._failing.add(destination)
            log.warning("outbox delivery to %s failed (%s); retrying with backoff, %d waiting",
                        destination, error, self.outbox.pending(destination))
        return retry_at

    def _recovered(self, destination: str) -> None:
        if destination in self._failing:
            self._failing.discard(destination)
            log.info("outbox delivery to %s works again", destination)

    def _report_delivered(self, destination: str, items: Sequence[Item]) -> None:
        by_kind: dict[str, int] = {}
        for item in items:
            by_kind[item.kind] = by_kind.get(item.kind, 0) + 1
        for kind, n in by_kind.items():
            self._observer.on_delivered(destination, kind, n)

    # ---- the loops -----------------------------------------------------------------------

    def _lane(self, destination: str) -> _Lane:
        lane = self._lanes.get(destination)
        if lane is None:
            lane = self._lanes[destination] = _Lane(destination)
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._run(lane),
                                            name=f"tierlink-outbox-{destination}")
        return lane

    async def _run(self, lane: _Lane) -> None:
        while True:
            lane.wake.clear()  # before looking: a kick during the round is not lost
            try:
                done = await self.deliver_once(lane.destination)
            except asyncio.CancelledError:
                raise
            except Exception:  # the store failed (disk?) or a bug: keep the loop alive
                log.exception("outbox delivery round for %s failed", lane.destination)
                await self._wait(lane, self.backoff.max_s)
                continue
            if done.sent and done.retry_at is None:
                continue  # more may be due right away
            await self._wait(lane, self._idle_delay(lane.destination, done))

    def _idle_delay(self, destination: str, done: Round) -> float | None:
        """Seconds until the head may be retried; None when the line is empty."""
        now = self._clock()
        if done.retry_at is not None:
            return max(0.0, done.retry_at - now)
        head = self.outbox.head(destination, now)
        return None if head is None else max(0.0, head.next_attempt_at - now)

    async def _wait(self, lane: _Lane, delay: float | None) -> None:
        """Until ``delay`` seconds passed (None: forever) or the lane is kicked."""
        if delay is None:
            await lane.wake.wait()
            return
        if delay <= 0:
            return
        sleeper = asyncio.ensure_future(self._sleep(delay))
        waker = asyncio.ensure_future(lane.wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, waker):
                task.cancel()
