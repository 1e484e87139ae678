"""Circuit breaker tests, driven by a fake clock (no sleeps)."""

from __future__ import annotations

import pytest

from tierlink.errors import ConfigError
from tierlink.node.breaker import BreakerBoard, BreakerSettings, CircuitBreaker


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(**settings: object) -> tuple[CircuitBreaker, FakeClock, list[tuple[str, str]]]:
    clock: FakeClock = FakeClock()
    seen: list[tuple[str, str]] = []
    breaker = CircuitBreaker(
        BreakerSettings(**settings),  # type: ignore[arg-type]
        clock=clock,
        on_transition=lambda old, new: seen.append((old, new)),
    )
    return breaker, clock, seen


def trip(breaker: CircuitBreaker, n: int = 3) -> None:
    for _ in range(n):
        breaker.record_failure()


def test_opens_after_threshold_consecutive_failures() -> None:
    breaker, _, seen = make(open_on_connect_error=False)
    trip(breaker, 2)
    breaker.record_success()  # resets the streak
    trip(breaker, 2)
    assert breaker.state == "closed" and breaker.allow()
    breaker.record_failure("connect")
    assert breaker.state == "open" and not breaker.allow()
    assert seen == [("closed", "open")]


def test_connect_failure_opens_at_once_when_enabled() -> None:
    breaker, _, _ = make()
    breaker.record_failure("timeout")
    assert breaker.state == "closed"
    breaker.record_failure("connect")
    assert breaker.state == "open"


def test_half_open_lets_exactly_one_probe_through() -> None:
    breaker, clock, seen = make()
    trip(breaker)
    assert breaker.retry_after_s(clock()) == pytest.approx(2.0)
    clock.advance(1.999)
    assert not breaker.allow() and not breaker.healthy()
    clock.advance(0.001)
    assert breaker.healthy() and breaker.retry_after_s() == 0.0
    assert breaker.allow()  # the probe
    assert breaker.state == "half_open"
    assert [breaker.allow() for _ in range(5)] == [False] * 5
    assert breaker.healthy()  # half-open is not "unhealthy": the router may plan on it
    assert seen[-1] == ("open", "half_open")


def test_probe_success_closes_and_resets_the_cooldown() -> None:
    breaker, clock, seen = make()
    trip(breaker)
    clock.advance(2.0)
    assert breaker.allow()
    breaker.record_failure()  # failed probe: cooldown 4 s
    clock.advance(4.0)
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == "closed" and breaker.allow() and breaker.cooldown_s == 2.0
    assert seen == [("closed", "open"), ("open", "half_open"), ("half_open", "open"),
                    ("open", "half_open"), ("half_open", "closed")]
    trip(breaker)  # the next open period starts from the base cooldown again
    assert breaker.retry_after_s() == pytest.approx(2.0)


def test_failed_probe_reopens_with_doubled_cooldown_up_to_the_cap() -> None:
    breaker, clock, _ = make(cooldown_s=2.0, max_cooldown_s=30.0)
    trip(breaker)
    cooldowns = []
    for _ in range(6):
        clock.advance(breaker.cooldown_s - 0.001)
        assert not breaker.allow()
        clock.advance(0.001)
        assert breaker.allow()
        breaker.record_failure()
        assert breaker.state == "open"
        cooldowns.append(breaker.cooldown_s)
    assert cooldowns == [4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_late_outcomes_while_open_change_nothing() -> None:
    breaker, clock, _ = make()
    trip(breaker)
    clock.advance(1.0)
    breaker.record_success()  # a call let through before it opened
    breaker.record_failure()
    assert breaker.state == "open" and breaker.cooldown_s == 2.0
    assert breaker.retry_after_s() == pytest.approx(1.0)


def test_lost_probe_is_replaced_after_the_probe_timeout() -> None:
    breaker, clock, _ = make(probe_timeout_s=5.0)
    trip(breaker)
    clock.advance(2.0)
    assert breaker.allow()
    clock.advance(4.0)
    assert not breaker.allow() and breaker.retry_after_s() == pytest.approx(1.0)
    clock.advance(1.0)
    assert breaker.allow()  # the first probe never reported back
    assert not breaker.allow()


def test_transition_hook_errors_do_not_break_the_breaker() -> None:
    def hook(old: str, new: str) -> None:
        raise RuntimeError("logging down")

    breaker = CircuitBreaker(clock=FakeClock(), on_transition=hook)  # type: ignore[arg-type]
    trip(breaker)
    assert breaker.state == "open"


def test_board_creates_breakers_on_demand_and_reports_health() -> None:
    clock, seen = FakeClock(), []
    board = BreakerBoard(
        BreakerSettings(failure_threshold=2), clock=clock,
        on_transition=lambda node, old, new: seen.append((node, old, new)),
    )
    assert board.healthy("edge-9") and board.states() == {}  # asking creates nothing
    assert board.allow("edge-1") and board.allow("cloud-1")
    board.record_failure("edge-1")
    board.record_failure("edge-1")
    board.record_success("cloud-1")
    assert board.states() == {"edge-1": "open", "cloud-1": "closed"}
    assert not board.healthy("edge-1") and board.healthy("cloud-1")
    assert board.retry_after_s("edge-1") == pytest.approx(2.0)
    assert board.retry_after_s("edge-9") == 0.0
    clock.advance(2.0)
    assert board.healthy("edge-1")  # due for a probe
    assert board.allow("edge-1") and not board.allow("edge-1")
    board.record_success("edge-1")
    assert board.states()["edge-1"] == "closed"
    assert seen == [("edge-1", "closed", "open"), ("edge-1", "open", "half_open"),
                    ("edge-1", "half_open", "closed")]
    assert board.breaker("edge-1") is board.breaker("edge-1")


@pytest.mark.parametrize("bad", [
    {"failure_threshold": 0}, {"cooldown_s": 0.0}, {"max_cooldown_s": 1.0},
    {"probe_timeout_s": float("inf")},
])
def test_settings_are_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        BreakerSettings(**bad)  # type: ignore[arg-type]
