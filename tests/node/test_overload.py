"""The overload gate: the level falls while the loop runs late and climbs back when it is
calm; batch gives way before interactive, realtime never by the level; a shed request waits
for room within its budget, else is refused with a retry hint — and, with the priority hint
header, before anything reads its body."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from tierlink.core.types import Priority
from tierlink.errors import AdmissionRefused
from tierlink.node.overload import OverloadGate, ShedEarly
from tierlink.settings.routing import OverloadConfig, parse_routing

# min_inflight 0: requests always count as competing, except in the test about that
CONFIG = OverloadConfig(target_lag_ms=10.0, window_s=0.1, step_down=0.5, step_up=0.25,
                        max_wait_s=0.2, min_inflight=0)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def window(gate: OverloadGate, clock: Clock, late_ms_per_100ms: float) -> None:
    """One window of probes whose lateness adds up to the given ms per 100 ms."""
    clock.t += CONFIG.window_s * 1.01  # (a hair over: sums of 0.1 fall short of 0.3)
    gate.observe_lag(late_ms_per_100ms * CONFIG.window_s * 10)


def gate_and_clock(**kw: Any) -> tuple[OverloadGate, Clock]:
    clock = Clock()
    gate = OverloadGate(CONFIG, clock=clock, rng=random.Random(1), **kw)
    gate.competing = True  # requests overlapped: shedding can help
    return gate, clock


def test_the_level_falls_under_lag_and_climbs_back_when_calm() -> None:
    gate, clock = gate_and_clock()
    assert gate.level == 3.0 and all(gate.admits(p) for p in Priority)
    window(gate, clock, 30.0)
    window(gate, clock, 30.0)
    assert gate.level == 2.0 and gate.lag_ms == pytest.approx(30.0, rel=0.02)
    assert not gate.admits(Priority.BATCH) and gate.admits(Priority.INTERACTIVE)
    for _ in range(5):
        window(gate, clock, 50.0)
    assert gate.level == 1.0  # the floor: realtime only
    assert gate.admits(Priority.REALTIME) and not gate.admits(Priority.INTERACTIVE)
    window(gate, clock, 8.0)  # between 70% of the target and the target: hold
    assert gate.level == 1.0
    for _ in range(8):
        window(gate, clock, 1.0)
    assert gate.level == 3.0


def test_a_stall_that_keeps_coming_back_counts_a_lone_one_does_not() -> None:
    gate, clock = gate_and_clock()
    assert gate.stall_ms() == 0.0
    gate.observe_lag(12.0)  # one probe woke 12 ms late: a lone stall
    window(gate, clock, 0.0)
    assert gate.stall_ms() == 0.0
    for _ in range(3):  # ... then in three windows more
        gate.observe_lag(12.0)
        window(gate, clock, 0.0)
    assert gate.stall_ms() == 12.0
    for _ in range(5):  # five calm windows later it is forgotten
        window(gate, clock, 0.0)
    assert gate.stall_ms() == 0.0


def test_the_class_at_the_edge_is_admitted_in_proportion() -> None:
    gate, _clock = gate_and_clock()
    gate.level = 2.5
    admitted = sum(gate.admits(Priority.BATCH) for _ in range(2000))
    assert 850 < admitted < 1150  # about half
    assert all(gate.admits(Priority.INTERACTIVE) for _ in range(100))


def test_a_shed_request_waits_for_room_then_is_refused_with_a_retry_hint() -> None:
    shed: list[tuple[str, str]] = []
    gate = OverloadGate(CONFIG, rng=random.Random(1),
                        on_shed=lambda p, outcome: shed.append((p.label, outcome)))
    gate.level, gate.competing = 1.0, True

    async def scenario() -> None:
        waiting = asyncio.ensure_future(gate.admit(Priority.INTERACTIVE, 150.0, "dev-1"))
        await asyncio.sleep(0.02)
        assert not waiting.done()  # held, not refused at once
        gate.level = 1.75
        gate._window_start = -1e9  # the next reading closes a window
        gate.observe_lag(0.0)  # calm: the level climbs past interactive, waiters look again
        await asyncio.wait_for(waiting, 1.0)
        gate.level = 1.0
        with pytest.raises(AdmissionRefused) as refused:
            await gate.admit(Priority.BATCH, 1000.0, "dev-1")
        exc = refused.value
        assert exc.http_status == 429 and exc.details["reason"] == "overloaded"
        assert exc.details["retry_after_s"] == 1.0 and "batch" in exc.message
        await gate.admit(Priority.REALTIME, 30.0, "dev-1")  # never shed by the level

    asyncio.run(scenario())
    assert shed == [("interactive", "waited"), ("batch", "refused")]


def test_a_short_deadline_waits_at_most_half_of_it() -> None:
    gate = OverloadGate(CONFIG)
    gate.level, gate.competing = 1.0, True

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(AdmissionRefused):
            await gate.admit(Priority.INTERACTIVE, 40.0, "dev-1")
        return loop.time() - start

    assert asyncio.run(scenario()) < 0.1


def test_the_priority_hint_sheds_before_the_body_is_read() -> None:
    gate = OverloadGate(OverloadConfig(max_wait_s=0.0))
    gate.level, gate.competing = 1.0, True
    reached: list[str] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body must not be read")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    middleware = ShedEarly(app, gate, "dev-1", lambda exc: b'{"code": "admission_refused"}')

    def scope(priority: bytes) -> dict[str, Any]:
        return {"type": "http", "path": "/v2/models/fmnist/infer",
                "headers": [(b"tierlink-priority", priority),
                            (b"tierlink-deadline-ms", b"1000")]}

    asyncio.run(middleware(scope(b"batch"), receive, send))
    assert reached == [] and sent[0]["status"] == 429
    assert (b"retry-after", b"1") in sent[0]["headers"]
    asyncio.run(middleware(scope(b"realtime"), receive, send))
    asyncio.run(middleware(scope(b"not-a-class"), receive, send))  # the parameters decide
    assert reached == ["/v2/models/fmnist/infer"] * 2


def test_nothing_is_shed_after_a_window_without_overlapping_requests() -> None:
    from dataclasses import replace

    clock = Clock()
    gate = OverloadGate(replace(CONFIG, min_inflight=2), clock=clock)
    gate.level = 1.0
    with gate.inside():  # one at a time: the lag is that request's own work
        pass
    window(gate, clock, 50.0)
    assert not gate.competing and all(gate.admits(p) for p in Priority)
    with gate.inside(), gate.inside():  # two at once
        assert gate.inflight == 2
    window(gate, clock, 50.0)
    assert gate.competing and not gate.admits(Priority.BATCH)
    assert gate.inflight == 0


def test_the_fleet_file_section() -> None:
    config = parse_routing({"overload": {"target_lag_ms": 12, "max_wait_s": 0}}).overload
    assert (config.target_lag_ms, config.max_wait_s, config.enabled) == (12.0, 0.0, True)
    assert not parse_routing({"overload": {"enabled": False}}).overload.enabled
    from tierlink.errors import ConfigError

    with pytest.raises(ConfigError, match="routing.overload.lag"):
        parse_routing({"overload": {"lag": 3}})
