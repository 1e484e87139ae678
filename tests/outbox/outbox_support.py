"""Fakes for the outbox tests: a clock, an observer that records, and an in-memory receiver
that dedupes with a real :class:`~tierlink.outbox.inbox.Inbox` on a temporary file."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence

from tierlink.errors import UpstreamTimeout, UpstreamUnavailable
from tierlink.outbox import Ack, AckStatus, Inbox, Item


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class RecordingObserver:
    def __init__(self) -> None:
        self.delivered: Counter[tuple[str, str]] = Counter()
        self.dropped: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()

    def on_delivered(self, destination: str, kind: str, n: int) -> None:
        self.delivered[(destination, kind)] += n

    def on_dropped(self, reason: str, n: int) -> None:
        self.dropped[reason] += n

    def on_retry(self, destination: str) -> None:
        self.retries[destination] += 1


class FakeReceiver:
    """A receiver following the ordering contract: applies a batch in order through its
    inbox and stops at the first transient failure.

    Knobs: ``down`` (every send raises), ``reject`` (keys refused for good), ``flaky_p``
    (each item fails transiently with this probability, seeded), ``lose_acks`` (the next n
    batches are applied but their answer is lost: the send raises a timeout).
    """

    def __init__(self, inbox: Inbox, *, seed: int = 0) -> None:
        self.inbox = inbox
        self.applied: defaultdict[str, list[str]] = defaultdict(list)  # dest -> keys, in order
        self.effects: Counter[str] = Counter()  # key -> times its effect ran
        self.down = False
        self.reject: set[str] = set()
        self.flaky_p = 0.0
        self.lose_acks = 0
        self.sends = 0
        self._rng = random.Random(seed)

    async def __call__(self, destination: str, items: Sequence[Item]) -> Sequence[Ack]:
        self.sends += 1
        if self.down:
            raise UpstreamUnavailable("receiver down")
        acks = self._apply(destination, items)
        if self.lose_acks > 0:
            self.lose_acks -= 1
            raise UpstreamTimeout("the answer was lost on the way back")
        return acks

    def _apply(self, destination: str, items: Sequence[Item]) -> list[Ack]:
        acks = []
        for i, item in enumerate(items):
            if item.key in self.reject:
                acks.append(Ack(item.key, AckStatus.REJECTED, "malformed"))
                continue
            if self._rng.random() < self.flaky_p:
                acks += [Ack(it.key, AckStatus.RETRY, "busy") for it in items[i:]]
                break
            _, duplicate = self.inbox.apply(
                item.key, lambda item=item: self._effect(destination, item))  # type: ignore[misc]
            acks.append(Ack(item.key, AckStatus.DUPLICATE if duplicate else AckStatus.OK))
        return acks

    def _effect(self, destination: str, item: Item) -> bytes:
        self.applied[destination].append(item.key)
        self.effects[item.key] += 1
        return b"ok"
