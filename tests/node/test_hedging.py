"""Hedged requests: the learned delay, the duplicate budget, the race and its loser."""

from __future__ import annotations

import asyncio
import time

from dispatch_support import Boards, Obs, timed_remote
from tierlink.core.types import Placement, Plan, Request, Tier
from tierlink.node.dispatcher import Dispatcher, RetryBudget, StepResult
from tierlink.node.hedging import HedgeConfig, Hedger, quantile

REQ = Request("r", "fmnist", 1000.0, "dev-1")
PLAN = Plan((Placement("remote", "edge-1", Tier.EDGE, est_ms=5.0),
             Placement("remote", "edge-2", Tier.EDGE, est_ms=5.0)), "tierlink")


def test_quantile_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.95) == 95.0
    assert quantile(values, 0.5) == 50.0
    assert quantile([7.0], 0.99) == 7.0


def test_delay_is_the_fastest_upstreams_quantile_once_it_has_enough_samples():
    h = Hedger(HedgeConfig(min_samples=5))
    for ms in (10, 11, 12, 13):
        h.observe("fmnist", "edge-1", ms)
    assert h.delay_ms("fmnist") is None  # too few
    h.observe("fmnist", "edge-1", 14)
    assert h.delay_ms("fmnist") == 14
    for _ in range(5):
        h.observe("fmnist", "edge-2", 300)  # a slow node does not make slow look normal
    assert h.delay_ms("fmnist") == 14
    assert h.delay_ms("mnist") is None
    assert Hedger(HedgeConfig(enabled=False, min_samples=1)).delay_ms("fmnist") is None


def test_budget_allows_about_its_share_of_requests():
    h = Hedger(HedgeConfig(budget=0.05))
    taken = 0
    for _ in range(1000):
        h.deposit()
        taken += h.take()
    assert 45 <= taken <= 55


def _dispatcher(latency_ms: dict[str, float], fail: set[str] = frozenset(), budget: float = 1.0):
    cancelled: list[str] = []

    remote = timed_remote(latency_ms, fail, cancelled)

    async def local(p, req, inputs, remaining):
        raise AssertionError("no local step in these plans")

    obs = Obs()
    hedger = Hedger(HedgeConfig(min_samples=3, budget=budget, min_delay_ms=1.0))
    for _ in range(3):
        hedger.observe("fmnist", "edge-2", 20.0)  # what a normal call takes
    d = Dispatcher("dev-1", Tier.DEVICE, local, remote, Boards(), RetryBudget(0.0), obs,
                   time.monotonic, hedger=hedger)
    return d, obs, cancelled


def _run(d: Dispatcher) -> StepResult:
    return asyncio.run(d.execute(PLAN, REQ, {}, time.monotonic() + 1.0))


def test_a_slow_call_is_hedged_the_hedge_wins_and_the_loser_is_cancelled():
    d, obs, cancelled = _dispatcher({"edge-1": 400.0, "edge-2": 20.0})
    start = time.monotonic()
    out = _run(d)
    took_ms = (time.monotonic() - start) * 1000
    assert out.outcome.served_by == "edge-2"
    assert took_ms < 200, took_ms  # ~20 ms delay + ~20 ms hedge, not 400 ms
    assert obs.hedges == [("edge-2", "sent"), ("edge-2", "won")]
    assert cancelled == ["edge-1"]


def test_a_fast_call_is_not_hedged():
    d, obs, cancelled = _dispatcher({"edge-1": 2.0, "edge-2": 20.0})
    assert _run(d).outcome.served_by == "edge-1"
    assert obs.hedges == [] and cancelled == []


def test_the_first_call_may_still_win_the_race():
    d, obs, cancelled = _dispatcher({"edge-1": 45.0, "edge-2": 200.0})
    assert _run(d).outcome.served_by == "edge-1"
    assert obs.hedges == [("edge-2", "sent"), ("edge-2", "lost")]
    assert cancelled == ["edge-2"]


def test_a_failed_hedge_leaves_the_first_call_and_the_target_is_not_tried_twice():
    d, obs, _ = _dispatcher({"edge-1": 60.0, "edge-2": 1.0}, fail={"edge-2"})
    out = _run(d)
    assert out.outcome.served_by == "edge-1"
    assert obs.hedges == [("edge-2", "sent"), ("edge-2", "lost")]
    assert [f.node_id for f in out.outcome.fallbacks] == ["edge-2"]


def test_no_budget_no_hedge():
    d, obs, _ = _dispatcher({"edge-1": 60.0, "edge-2": 20.0}, budget=0.0)
    assert _run(d).outcome.served_by == "edge-1"
    assert obs.hedges == [("edge-2", "no_budget")]


def test_no_hedge_when_the_deadline_has_no_room_for_it():
    d, obs, _ = _dispatcher({"edge-1": 60.0, "edge-2": 20.0})
    # 24 ms left: after a 20 ms delay the hedge's own 5 ms estimate does not fit.
    out = asyncio.run(d.execute(PLAN, REQ, {}, time.monotonic() + 0.024))
    assert obs.hedges == [] and out.outcome.served_by == "edge-1"


def test_a_hedge_is_traced_with_its_outcome():
    from tierlink.telemetry import tracing
    from tierlink.testing.spans import recorded_spans

    d, _obs, _cancelled = _dispatcher({"edge-1": 400.0, "edge-2": 20.0})
    with recorded_spans() as exporter, tracing.span("tierlink.route", None, {}):
        _run(d)  # stages are children of a node's route span
    (hedge,) = [s for s in exporter.get_finished_spans() if s.name == "tierlink.hedge"]
    assert hedge.attributes["tierlink.peer"] == "edge-2"
    assert hedge.attributes["tierlink.instead_of"] == "edge-1"
    assert hedge.attributes["tierlink.outcome"] == "answered"
