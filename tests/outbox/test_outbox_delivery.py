from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from outbox_support import FakeClock, FakeReceiver, RecordingObserver

from tierlink.outbox import Ack, AckStatus, Backoff, Deliverer, Inbox, Item, Outbox, Round


class Setup:
    def __init__(self, tmp_path: Path, *, batch: int = 4, seed: int = 0) -> None:
        self.clock = FakeClock()
        self.seen = RecordingObserver()
        self.outbox = Outbox(tmp_path / "outbox.db", clock=self.clock, observer=self.seen)
        self.receiver = FakeReceiver(Inbox(tmp_path / "inbox.db", clock=self.clock), seed=seed)
        self.deliverer = Deliverer(self.outbox, self.receiver, clock=self.clock,
                                   sleep=self.sleep, rng=random.Random(seed), batch=batch,
                                   observer=self.seen)

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await asyncio.sleep(0)

    def put(self, destination: str, n: int, kind: str = "result",
            ttl_s: float | None = None) -> list[Item]:
        return [self.outbox.put(destination, kind, f"{destination}-{i}".encode(), ttl_s=ttl_s)
                for i in range(n)]

    async def drain(self, destination: str, rounds: int = 1000) -> None:
        """Deliver round by round, jumping the clock to each retry time."""
        for _ in range(rounds):
            done = await self.deliverer.deliver_once(destination)
            if done.retry_at is not None:
                self.clock.t = max(self.clock.t, done.retry_at)
            elif not done.sent:
                head = self.outbox.head(destination, self.clock.t)
                if head is None:
                    return
                self.clock.t = max(self.clock.t, head.next_attempt_at)
        raise AssertionError(f"{destination} did not drain")


def test_delivers_in_batches_in_order(tmp_path: Path) -> None:
    s = Setup(tmp_path, batch=4)
    items = s.put("edge-1", 10)
    first = asyncio.run(s.deliverer.deliver_once("edge-1"))
    assert first == Round(sent=4, delivered=4)
    asyncio.run(s.drain("edge-1"))
    assert s.receiver.applied["edge-1"] == [i.key for i in items]
    assert s.outbox.pending() == 0
    assert s.seen.delivered == {("edge-1", "result"): 10}
    assert s.receiver.sends == 3


def test_order_per_destination_holds_under_transient_failures(tmp_path: Path) -> None:
    s = Setup(tmp_path, batch=5, seed=3)
    s.receiver.flaky_p = 0.3
    keys = {d: [i.key for i in s.put(d, 40)] for d in ("edge-1", "edge-2")}
    for d in keys:
        asyncio.run(s.drain(d))
    for d, expected in keys.items():
        assert s.receiver.applied[d] == expected  # same order, each once
    assert set(s.receiver.effects.values()) == {1}
    assert sum(s.seen.retries.values()) > 5  # the failures did happen


def test_a_transient_failure_holds_the_line_until_the_backoff_passes(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    items = s.put("edge-1", 3)
    s.receiver.down = True
    failed = asyncio.run(s.deliverer.deliver_once("edge-1"))
    assert failed.retry_at is not None and failed.delivered == 0
    assert 0.16 <= failed.retry_at - s.clock.t <= 0.24  # base 0.2 s, jitter 20%
    assert asyncio.run(s.deliverer.deliver_once("edge-1")) == Round()  # nothing overtakes
    s.receiver.down = False
    s.clock.t = failed.retry_at
    asyncio.run(s.drain("edge-1"))
    assert s.receiver.applied["edge-1"] == [i.key for i in items]
    assert s.seen.retries == {"edge-1": 1}


def test_backoff_grows_with_the_head_attempts(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.put("edge-1", 1)
    s.receiver.down = True
    delays = []
    for _ in range(8):
        done = asyncio.run(s.deliverer.deliver_once("edge-1"))
        assert done.retry_at is not None
        delays.append(done.retry_at - s.clock.t)
        s.clock.t = done.retry_at
    assert delays[1] > delays[0] * 1.3 and delays[3] > delays[2] * 1.3
    assert max(delays) <= 10 * 1.2
    head = s.outbox.head("edge-1", s.clock.t)
    assert head is not None and head.attempts == 8 and "receiver down" in str(head.last_error)


def test_backoff_delay() -> None:
    rng = random.Random(1)
    b = Backoff(base_s=1, max_s=8, jitter=0.0)
    assert [b.delay(n, rng) for n in (1, 2, 3, 4, 5, 10_000)] == [1, 2, 4, 8, 8, 8]
    jittered = [Backoff(base_s=1, jitter=0.5).delay(1, rng) for _ in range(200)]
    assert 0.5 <= min(jittered) < 0.6 and 1.4 < max(jittered) <= 1.5


def test_a_permanent_rejection_is_dropped_and_the_line_moves_on(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    items = s.put("edge-1", 4)
    s.receiver.reject.add(items[1].key)
    done = asyncio.run(s.deliverer.deliver_once("edge-1"))
    assert done == Round(sent=4, delivered=3, rejected=1)
    assert s.receiver.applied["edge-1"] == [items[0].key, items[2].key, items[3].key]
    assert s.seen.dropped == {"rejected": 1}
    assert s.outbox.pending() == 0


def test_a_lost_ack_is_retried_and_the_inbox_applies_it_once(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    items = s.put("edge-1", 3)
    s.receiver.lose_acks = 1
    lost = asyncio.run(s.deliverer.deliver_once("edge-1"))
    assert lost.delivered == 0 and lost.retry_at is not None  # applied, but we don't know
    assert s.outbox.pending() == 3
    asyncio.run(s.drain("edge-1"))
    assert s.receiver.applied["edge-1"] == [i.key for i in items]
    assert set(s.receiver.effects.values()) == {1}
    assert s.seen.delivered == {("edge-1", "result"): 3}


def test_items_expire_while_the_receiver_is_down(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.put("edge-1", 2, ttl_s=5)
    late = s.put("edge-1", 1, ttl_s=500)
    s.receiver.down = True
    for _ in range(10):  # about 0.2+0.4+...: past 5 s after a few rounds
        done = asyncio.run(s.deliverer.deliver_once("edge-1"))
        s.clock.t = done.retry_at or s.clock.t
    s.receiver.down = False
    asyncio.run(s.drain("edge-1"))
    assert s.receiver.applied["edge-1"] == [late[0].key]
    assert s.seen.dropped == {"expired": 2}


def test_missing_acks_and_later_acks_after_a_retry_are_not_trusted(tmp_path: Path) -> None:
    clock = FakeClock()
    outbox = Outbox(tmp_path / "o.db", clock=clock)
    a, b, c = (outbox.put("edge-1", "result", bytes([i])) for i in range(3))

    async def send(destination: str, items: Sequence[Item]) -> Sequence[Ack]:
        # a receiver breaking the contract: b retried, c claimed ok anyway; a has no ack
        return [Ack(b.key, AckStatus.RETRY, "busy"), Ack(c.key, AckStatus.OK)]

    d = Deliverer(outbox, send, clock=clock, rng=random.Random(0))
    done = asyncio.run(d.deliver_once("edge-1"))
    assert done.delivered == 0 and done.retry_at is not None
    head = outbox.head("edge-1", clock.t)
    assert head is not None and head.id == a.id and head.last_error == "no ack for this item"
    assert outbox.pending() == 3


def test_the_loops_deliver_after_a_kick_and_stop_cleanly(tmp_path: Path) -> None:
    s = Setup(tmp_path, batch=8)

    async def run() -> None:
        early = s.put("edge-1", 3)  # waiting before start: found by start()
        s.deliverer.start()
        s.receiver.down = True
        await _until(lambda: s.seen.retries["edge-1"] >= 2)
        s.receiver.down = False
        late = s.put("cloud-1", 5)
        s.deliverer.kick("cloud-1")
        await _until(lambda: s.outbox.pending() == 0)
        await s.deliverer.stop()
        await asyncio.sleep(0)  # let the cancelled waits finish
        assert asyncio.all_tasks() == {asyncio.current_task()}  # no loop left behind
        assert s.receiver.applied["edge-1"] == [i.key for i in early]
        assert s.receiver.applied["cloud-1"] == [i.key for i in late]

    asyncio.run(run())


def test_a_store_failure_does_not_end_the_loop(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                               ) -> None:
    s = Setup(tmp_path)
    real_due = s.outbox.due
    calls = {"n": 0}

    def flaky_due(destination: str, now: float, limit: int) -> list[Item]:
        calls["n"] += 1
        if calls["n"] == 1:
            from tierlink.errors import OutboxError
            raise OutboxError("disk I/O error")
        return real_due(destination, now, limit)

    s.outbox.due = flaky_due  # type: ignore[method-assign]

    async def run() -> None:
        items = s.put("edge-1", 2)
        s.deliverer.start()
        await _until(lambda: s.outbox.pending() == 0)
        await s.deliverer.stop()
        assert s.receiver.applied["edge-1"] == [i.key for i in items]

    asyncio.run(run())
    assert "delivery round for edge-1 failed" in caplog.text


async def _until(condition: object, steps: int = 10_000) -> None:
    for _ in range(steps):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")
