import asyncio

import numpy as np
import pytest

from tierlink.core.types import Bill, Outcome, Placement, Plan, Request, Tier
from tierlink.errors import (
    DeadlineExceeded,
    InvalidRequest,
    PrivacyViolation,
    TensorError,
    UpstreamError,
    UpstreamUnavailable,
)
from tierlink.node.breaker import BreakerBoard
from tierlink.node.dispatcher import Dispatcher, RetryBudget, StepResult


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Obs:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def escalated(self, model: str) -> None:
        self.events.append(("escalated", model))

    def fell_back(self, node_id: str, reason: str) -> None:
        self.events.append((reason, node_id))

    def retried(self, node_id: str) -> None:
        self.events.append(("retried", node_id))


class Boards:
    def __init__(self, clock) -> None:
        self.board = BreakerBoard(clock=clock)

    def allow(self, n):
        return self.board.allow(n)

    def success(self, n):
        self.board.record_success(n)

    def failure(self, n, kind):
        self.board.record_failure(n, "connect" if kind == "unavailable" else kind)


def answer(node: str, tier: Tier, conf: float, cost: float = 1.0) -> StepResult:
    return StepResult({"label": np.array([1])}, Outcome(node, tier, f"{node}-m", (node,), conf,
                                                        bill=Bill.of_compute(tier, cost)))


def make(local_conf=0.5, remote=None, clock=None):
    clock = clock or Clock()
    calls: list[str] = []
    remote = remote or {}

    async def local(p, req, inputs, remaining):
        calls.append(p.node_id)
        return answer(p.node_id, p.tier, local_conf, cost=0.1)

    async def remote_step(p, req, inputs, remaining, budget):
        calls.append(p.node_id)
        behaviour = remote.get(p.node_id, 0.99)
        if isinstance(behaviour, Exception):
            raise behaviour
        return answer(p.node_id, p.tier, behaviour)

    obs = Obs()
    boards = Boards(clock)
    d = Dispatcher("dev-1", Tier.DEVICE, local, remote_step, boards, RetryBudget(0.0), obs, clock)
    return d, calls, obs, boards


REQ = Request("r", "fmnist", 150.0, "dev-1")
CASCADE = Plan((Placement("local", "dev-1", Tier.DEVICE, "s", 0.9),
                Placement("remote", "edge-1", Tier.EDGE), Placement("remote", "edge-2", Tier.EDGE)),
               "tierlink")


def run(d, plan=CASCADE, deadline_at=100.15):
    return asyncio.run(d.execute(plan, REQ, {}, deadline_at))


def test_confident_local_answer_is_final():
    d, calls, _obs, _ = make(local_conf=0.95)
    out = run(d)
    assert calls == ["dev-1"] and out.outcome.served_by == "dev-1" and out.outcome.escalations == 0


def test_low_confidence_escalates_and_sums_cost():
    d, calls, obs, _ = make(local_conf=0.5)
    out = run(d)
    assert calls == ["dev-1", "edge-1"]
    assert out.outcome.served_by == "edge-1" and out.outcome.escalations == 1
    assert out.outcome.path == ("dev-1", "edge-1")
    assert out.outcome.cost == pytest.approx(1.1)
    assert ("escalated", "s") in obs.events


def test_what_goes_up_with_an_answer_in_hand_is_marked_an_escalation():
    """The receiver refuses escalations first when busy (``escalation_queue``), so a call
    made while holding an answer says so — its fallback too — and a first placement does
    not."""
    seen: list[tuple[str, bool]] = []

    async def local(p, req, inputs, remaining):
        return answer(p.node_id, p.tier, 0.5, cost=0.1)

    async def remote(p, req, inputs, remaining, budget):
        seen.append((p.node_id, req.escalation))
        if p.node_id == "edge-1":
            raise UpstreamUnavailable("down")
        return answer(p.node_id, p.tier, 0.99)

    def dispatcher() -> Dispatcher:  # breakers of its own: edge-1 is down for each
        clock = Clock()
        return Dispatcher("dev-1", Tier.DEVICE, local, remote, Boards(clock),
                          RetryBudget(0.0), Obs(), clock)

    assert run(dispatcher()).outcome.served_by == "edge-2"
    assert seen == [("edge-1", True), ("edge-2", True)]
    seen.clear()
    direct = Plan(CASCADE.placements[1:], "tierlink")
    assert run(dispatcher(), plan=direct).outcome.served_by == "edge-2"
    assert seen == [("edge-1", False), ("edge-2", False)]


def test_failed_upstream_falls_back_and_is_recorded():
    d, calls, obs, _ = make(remote={"edge-1": UpstreamUnavailable("refused")})
    out = run(d)
    assert calls == ["dev-1", "edge-1", "edge-2"]
    assert out.outcome.served_by == "edge-2"
    assert [(f.node_id, f.reason) for f in out.outcome.fallbacks] == [("edge-1", "unavailable")]
    assert ("unavailable", "edge-1") in obs.events


def test_open_breaker_skips_the_dead_node_on_later_requests():
    d, calls, _, _boards = make(remote={"edge-1": UpstreamUnavailable("refused")})
    run(d)
    calls.clear()
    out = run(d)
    assert "edge-1" not in calls
    assert ("edge-1", "breaker_open") in [(f.node_id, f.reason) for f in out.outcome.fallbacks]


def test_low_confidence_answer_is_returned_degraded_when_upstream_fails():
    err = UpstreamUnavailable("down")
    d, _, _, _ = make(remote={"edge-1": err, "edge-2": UpstreamUnavailable("down")})
    out = run(d)
    assert out.outcome.served_by == "dev-1" and out.outcome.degraded == "upstream_failed"


def test_every_placement_failing_raises_with_the_fallbacks():
    plan = Plan((Placement("remote", "edge-1", Tier.EDGE),), "tierlink")
    d, _, _, _ = make(remote={"edge-1": UpstreamUnavailable("down")})
    with pytest.raises(UpstreamError) as info:
        run(d, plan)
    assert info.value.details["fallbacks"][0]["node"] == "edge-1"


def test_every_upstream_refusing_for_privacy_is_a_privacy_refusal_to_the_caller():
    """An upstream's router refused the plan its policy made (a baseline that ignores
    privacy, forwarded): the caller hears 403 privacy_violation, not a broken upstream."""
    plan = Plan((Placement("remote", "edge-1", Tier.EDGE), Placement("remote", "edge-2",
                                                                     Tier.EDGE)), "cloud_only")
    refused = {n: PrivacyViolation("policy 'cloud_only' planned to send a 'site' request's "
                                   "input to cloud-1 (cloud); refused") for n in ("edge-1",
                                                                                "edge-2")}
    d, _, _, _ = make(remote=refused)
    with pytest.raises(PrivacyViolation) as info:
        run(d, plan)
    assert info.value.http_status == 403
    assert [f["node"] for f in info.value.details["fallbacks"]] == ["edge-1", "edge-2"]


def test_no_time_left_after_local_answers_degraded_instead_of_late():
    clock = Clock()
    d, calls, _, _ = make(local_conf=0.5, clock=clock)
    original = d._local

    async def slow_local(p, req, inputs, remaining):
        clock.t += 0.1495  # the local model used almost all of the 150 ms
        return await original(p, req, inputs, remaining)

    d._local = slow_local
    out = asyncio.run(d.execute(CASCADE, REQ, {}, clock.t + 0.150))
    assert calls == ["dev-1"] and out.outcome.degraded == "upstream_failed"
    assert out.outcome.fallbacks[0].reason == "deadline"


def test_deadline_error_when_nothing_could_run():
    clock = Clock()
    d, _, _, _ = make(clock=clock)
    with pytest.raises(DeadlineExceeded):
        asyncio.run(d.execute(CASCADE, REQ, {}, clock.t - 1))


def test_retry_budget_spends_tokens():
    b = RetryBudget(0.5)
    assert b.take() and not b.take()
    b.deposit()
    b.deposit()
    assert b.take()


def test_escalation_that_cannot_return_in_time_is_not_started():
    clock = Clock()
    d, calls, _, _ = make(local_conf=0.5, clock=clock)
    plan = Plan((Placement("local", "dev-1", Tier.DEVICE, "s", 0.9),
                 Placement("remote", "edge-1", Tier.EDGE, est_ms=200.0)), "tierlink")
    out = asyncio.run(d.execute(plan, REQ, {}, clock.t + 0.150))
    assert calls == ["dev-1"] and out.outcome.served_by == "dev-1"
    assert out.outcome.fallbacks[0].reason == "deadline"


def test_a_stalling_loop_gives_an_escalation_less_time_so_the_answer_in_hand_is_on_time():
    """While holding an answer, an escalation's budget keeps the loop's recent stall back
    where it is longer than the margin: the hop gets less time, and one that can no longer
    come back in time is not started."""
    budgets: list[float] = []
    clock = Clock()
    d, calls, _, _ = make(local_conf=0.5, clock=clock)
    original = d._remote

    async def remote(p, req, inputs, remaining, budget):
        budgets.append(budget)
        return await original(p, req, inputs, remaining, budget)

    d._remote = remote
    plan = Plan((Placement("local", "dev-1", Tier.DEVICE, "s", 0.9),
                 Placement("remote", "edge-1", Tier.EDGE, est_ms=100.0)), "tierlink")
    asyncio.run(d.execute(plan, REQ, {}, clock.t + 0.150))
    d.stall_ms = lambda: 20.0
    asyncio.run(d.execute(plan, REQ, {}, clock.t + 0.150))
    d.stall_ms = lambda: 0.5  # within the margin: nothing changes
    asyncio.run(d.execute(plan, REQ, {}, clock.t + 0.150))
    assert budgets == [pytest.approx(149.0), pytest.approx(130.0), pytest.approx(149.0)]
    d.stall_ms = lambda: 60.0  # 150 - 60 < 100: it could not come back in time
    out = asyncio.run(d.execute(plan, REQ, {}, clock.t + 0.150))
    assert out.outcome.served_by == "dev-1" and out.outcome.fallbacks[0].reason == "deadline"
    assert calls == ["dev-1", "edge-1"] * 3 + ["dev-1"]


def test_a_client_error_from_an_upstream_goes_back_to_the_caller_without_a_fallback():
    """An upstream's 400 says the request is wrong, not the node: no other node is tried,
    nothing counts against the upstream's breaker, and the caller gets the 400."""
    plan = Plan((Placement("remote", "edge-1", Tier.EDGE),
                 Placement("remote", "edge-2", Tier.EDGE)), "tierlink")
    d, calls, obs, boards = make(remote={"edge-1": TensorError("input 'x' must be FP32")})
    with pytest.raises(TensorError, match="must be FP32"):
        run(d, plan)
    assert calls == ["edge-1"] and obs.events == []
    assert boards.board.states().get("edge-1", "closed") == "closed"


def test_a_split_tail_refusing_its_payload_is_a_failure_to_fall_back_from():
    plan = Plan((Placement("remote", "edge-1", Tier.EDGE, "s", cut="h", codec="fp16"),
                 Placement("remote", "edge-2", Tier.EDGE)), "tierlink")
    d, calls, _, _ = make(remote={"edge-1": InvalidRequest("bad features")})
    out = run(d, plan)
    assert calls == ["edge-1", "edge-2"] and out.outcome.served_by == "edge-2"


def test_stages_are_traced_escalation_and_fallback_with_their_reasons():
    from tierlink.telemetry import tracing
    from tierlink.testing.spans import recorded_spans

    d, _calls, _obs, _ = make(local_conf=0.5, remote={"edge-1": UpstreamUnavailable("down")})
    with recorded_spans() as exporter, tracing.span("tierlink.route", None, {}):
        run(d)  # stages are children of a node's route span
    spans = {s.name: dict(s.attributes) for s in exporter.get_finished_spans()}
    assert spans["tierlink.escalation"] == {
        "tierlink.confidence": 0.5, "tierlink.threshold": 0.9, "tierlink.escalate": True,
        "tierlink.model": "s", "tierlink.next": "edge-1"}
    assert spans["tierlink.fallback"]["tierlink.peer"] == "edge-1"
    assert spans["tierlink.fallback"]["tierlink.reason"] == "unavailable"


def test_an_upstream_refusing_what_it_was_sent_keeps_its_breaker_closed():
    """A peer that refuses this node's claims (or an input it may not hold) is up and
    judging correctly: the plan falls back, the breaker stays closed for later requests."""
    from tierlink.errors import PeerRefused

    refusal = PeerRefused("edge-1: a 'local' input arrived from node dev-1",
                          reason="local_forwarded")
    d, calls, _, boards = make(remote={"edge-1": refusal})
    for _ in range(5):
        out = run(d)
        assert out.outcome.served_by == "edge-2"
    assert calls.count("edge-1") == 5
    assert boards.board.states().get("edge-1", "closed") == "closed"
