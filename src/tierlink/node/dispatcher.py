"""The dispatcher executes a policy's ``Plan``: the runtime around a pure decision.

For each placement in order it checks the circuit breaker, gives the hop a timeout from the
remaining deadline, runs it, and then either answers, escalates (the answer's confidence is
below the placement's threshold) or falls back (the placement failed). A transient upstream
failure may be retried once on the same node within a retry budget. Every fallback and
escalation is recorded in the ``Outcome`` and counted; nothing is swallowed. When later
placements fail after a low-confidence answer, that answer is returned, marked degraded,
rather than an error.

A remote placement whose call takes longer than usual may be **hedged** (``node/hedging.py``):
after the learned delay a copy goes to the plan's next remote placement (another node), the
first answer wins and the loser is cancelled; that next placement is then not tried again.

A *local* answer that is escalated for low confidence is also handed to ``on_hard_example``
(the hard-example loop): synchronously, on the event loop, before the next placement runs.
Answers that fail, or that fall back, are never handed over: only low confidence counts.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any, Protocol

from tierlink.core.types import NO_BILL, Bill, Fallback, Placement, Plan, Request, Tier
from tierlink.errors import (
    AdmissionRefused,
    DeadlineExceeded,
    EscalationShed,
    InvalidRequest,
    Overloaded,
    PeerRefused,
    PrivacyViolation,
    TierlinkError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from tierlink.node.hedging import Hedger
from tierlink.node.steps import (
    Await,
    Call,
    Cancel,
    Command,
    Finished,
    Inputs,
    LocalStep,
    RemoteStep,
    Start,
    StepResult,
    Steps,
    observed,
    run_steps,
)
from tierlink.telemetry import tracing

__all__ = ["Dispatcher", "HardExampleHook", "RetryBudget", "StepResult", "execute_observed",
           "reason_of"]

# on_hard_example(placement, request, inputs, local answer): must not block or raise
HardExampleHook = Callable[[Placement, Request, Inputs, StepResult], None]


def _ignore(_p: Placement, _r: Request, _i: Inputs, _s: StepResult) -> None:
    return None


class Breakers(Protocol):
    def allow(self, node_id: str) -> bool: ...
    def success(self, node_id: str) -> None: ...
    def failure(self, node_id: str, kind: str) -> None: ...


# Baselines ignore deadlines: their hops still get a finite timeout so nothing hangs.
ADVISORY_DEADLINE_MS = 10_000.0


class RetryBudget:
    """Retries may add at most ``ratio`` of the request rate (Envoy-style retry budget):
    each request deposits ``ratio`` tokens, each retry spends one."""

    def __init__(self, ratio: float, cap: float = 10.0) -> None:
        self._ratio = ratio
        self._cap = cap
        self._tokens = 1.0 if ratio > 0 else 0.0

    def deposit(self) -> None:
        self._tokens = min(self._cap, self._tokens + self._ratio)

    def take(self) -> bool:
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class DispatchObserver(Protocol):
    def escalated(self, model: str) -> None: ...
    def fell_back(self, node_id: str, reason: str) -> None: ...
    def retried(self, node_id: str) -> None: ...
    def hedged(self, node_id: str, outcome: str) -> None: ...


def reason_of(exc: TierlinkError) -> str:
    """A short, bounded label for metrics and outcomes."""
    if isinstance(exc, UpstreamTimeout | DeadlineExceeded):
        return "timeout"
    if isinstance(exc, EscalationShed):
        return EscalationShed.code
    if isinstance(exc, AdmissionRefused | Overloaded):
        return "refused"
    if isinstance(exc, UpstreamUnavailable):
        return "unavailable"
    if isinstance(exc, UpstreamError):
        return "upstream_error"
    return exc.code


def _no_stall() -> float:
    return 0.0


class Dispatcher:
    """Executes plans for one node. ``clock`` is monotonic seconds (injected).
    ``stall_ms``: how late the node's event loop has lately kept running at once (the
    overload gate's probe): an escalation made while holding an answer keeps that much of the
    deadline back when it is more than the margin, so the answer in hand still leaves on
    time when the loop stalls.

    :meth:`steps` decides (sans-IO, ``node/steps.py``); :meth:`execute` carries the steps
    out on asyncio with ``local`` and ``remote`` (a live node's); the simulator carries them
    out on virtual time (``sim/dispatch.py``) and gives neither."""

    def __init__(
        self, node_id: str, tier: Tier, local: LocalStep | None, remote: RemoteStep | None,
        breakers: Breakers, budget: RetryBudget, observer: DispatchObserver,
        clock: Callable[[], float], margin_ms: float = 1.0,
        on_hard_example: HardExampleHook = _ignore, hedger: Hedger | None = None,
    ) -> None:
        self._node_id, self._tier = node_id, tier
        self._hedger = hedger
        self._on_hard_example = on_hard_example
        self._local, self._remote = local, remote
        self._breakers, self._budget, self._obs = breakers, budget, observer
        self._clock, self._margin_ms = clock, margin_ms
        self.stall_ms: Callable[[], float] = _no_stall

    async def execute(
        self, plan: Plan, req: Request, inputs: Inputs, deadline_at: float
    ) -> StepResult:
        """Run ``plan`` until an answer is final; ``deadline_at`` on the injected clock."""
        return await self.run(self.steps(plan, req, inputs, deadline_at), req, inputs)

    async def run(self, steps: Steps, req: Request, inputs: Inputs) -> StepResult:
        """``steps`` (of :meth:`steps`, maybe wrapped) carried out on asyncio."""
        if self._local is None or self._remote is None:
            raise RuntimeError("this dispatcher only decides: its steps are run elsewhere")
        return await run_steps(steps, self._local, self._remote, req, inputs)

    def steps(self, plan: Plan, req: Request, inputs: Inputs, deadline_at: float) -> Steps:
        """What running ``plan`` takes, as commands (``node/steps.py``); its value is the
        final answer."""
        self._budget.deposit()
        if self._hedger is not None:
            self._hedger.deposit()
        in_hand: StepResult | None = None
        fallbacks: list[Fallback] = []
        escalations, spent = 0, NO_BILL  # spent: what answers superseded by an escalation cost
        tried: set[int] = set()  # placements a hedge already tried
        for i, placement in enumerate(plan.placements):
            if i in tried:
                continue
            remaining_ms = (deadline_at - self._clock()) * 1000.0
            if not plan.respects_deadline:
                remaining_ms = max(remaining_ms, ADVISORY_DEADLINE_MS)
            elif remaining_ms <= self._margin_ms:
                self._fell_back(fallbacks, Fallback(placement.node_id, "deadline",
                                                    "no time left to try"))
                break
            result = yield from self._attempt(placement, req, remaining_ms,
                                              in_hand is not None, fallbacks,
                                              self._hedge_target(plan, i, tried), tried)
            if result is None:
                continue
            if in_hand is not None:
                spent = spent + in_hand.outcome.bill
            in_hand = result
            if self._escalate(placement, result, i, plan):
                escalations += 1
                self._obs.escalated(placement.model or "")
                if placement.kind == "local":  # an upstream reports its own hard examples
                    self._on_hard_example(placement, req, inputs, result)
                continue
            return self._finish(result, fallbacks, escalations, spent, "")
        if in_hand is not None:
            return self._finish(in_hand, fallbacks, escalations, spent, "upstream_failed")
        raise _all_failed(req, fallbacks)

    def _escalate(self, placement: Placement, result: StepResult, i: int, plan: Plan) -> bool:
        below = placement.escalate_below
        go = (below is not None and result.outcome.confidence < below
              and i + 1 < len(plan.placements))
        if below is not None and tracing.enabled():
            tracing.mark("tierlink.escalation", {
                "tierlink.confidence": result.outcome.confidence, "tierlink.threshold": below,
                "tierlink.escalate": go, "tierlink.model": placement.model or "",
                "tierlink.next": plan.placements[i + 1].node_id
                if i + 1 < len(plan.placements) else ""})
        return go

    def _attempt(
        self, placement: Placement, req: Request, remaining_ms: float, holding: bool,
        fallbacks: list[Fallback], hedge: tuple[int, Placement] | None = None,
        tried: set[int] | None = None,
    ) -> Generator[Command, Any, StepResult | None]:
        if placement.kind == "local":
            return (yield from self._try(Call(placement, remaining_ms, remaining_ms), fallbacks))
        held_margin_ms = max(self._margin_ms, self.stall_ms()) if holding else 0.0
        if holding and remaining_ms - held_margin_ms < placement.est_ms:
            # Escalating cannot come back in time: keep the answer in hand, spare the upstream.
            self._fell_back(fallbacks, Fallback(placement.node_id, "deadline",
                                                f"{remaining_ms:.1f} ms left, the hop needs "
                                                f"~{placement.est_ms:.1f} ms"))
            return None
        if not self._breakers.allow(placement.node_id):
            self._fell_back(fallbacks, Fallback(placement.node_id, "breaker_open"))
            return None
        # Keep a margin to still return the answer in hand if this hop times out.
        call = Call(placement, remaining_ms, remaining_ms - held_margin_ms, holding)
        result, hedged = yield from self._first_try(call, req, fallbacks, hedge)
        if hedged and hedge is not None and tried is not None:
            tried.add(hedge[0])
        if result is None and not hedged and self._retryable(fallbacks[-1], placement, remaining_ms):
            self._obs.retried(placement.node_id)
            fallbacks[-1] = replace(fallbacks[-1], detail=fallbacks[-1].detail + " (retried)")
            result = yield from self._try(call, fallbacks)
        return result

    def _hedge_target(self, plan: Plan, i: int, tried: set[int]
                      ) -> tuple[int, Placement] | None:
        """The placement a hedge of ``plan.placements[i]`` would go to: the next plain remote
        one on another node whose breaker is closed."""
        first = plan.placements[i]
        if self._hedger is None or first.kind != "remote" or first.cut:
            return None
        for j in range(i + 1, len(plan.placements)):
            other = plan.placements[j]
            if (other.kind == "remote" and not other.cut and other.node_id != first.node_id
                    and j not in tried and self._breakers.allow(other.node_id)):
                return j, other
        return None

    def _first_try(
        self, call: Call, req: Request, fallbacks: list[Fallback],
        hedge: tuple[int, Placement] | None,
    ) -> Generator[Command, Any, tuple[StepResult | None, bool]]:
        """One call upstream, hedged when it runs late; ``(answer, whether a hedge went)``."""
        start = self._clock()
        delay_ms = None if hedge is None or self._hedger is None \
            else self._hedger.delay_ms(req.task)
        if (hedge is None or self._hedger is None or delay_ms is None
                or call.remaining_ms - delay_ms - self._margin_ms < hedge[1].est_ms):
            result = yield from self._try(call, fallbacks)
            return self._timed(call.placement, req, result, start), False
        yield Start(0, call)
        finished = yield Await(delay_ms / 1000.0)
        if finished is None and not self._hedger.take():
            self._obs.hedged(hedge[1].node_id, "no_budget")
            finished = yield Await(None)
        if finished is not None:
            return self._settled(call.placement, req, finished, fallbacks, start), False
        return (yield from self._race(call, hedge[1], req, fallbacks, start)), True

    def _race(
        self, call: Call, second: Placement, req: Request, fallbacks: list[Fallback],
        start: float,
    ) -> Generator[Command, Any, StepResult | None]:
        elapsed_ms = (self._clock() - start) * 1000.0
        self._obs.hedged(second.node_id, "sent")
        yield Start(1, Call(second, call.remaining_ms - elapsed_ms, call.budget_ms - elapsed_ms,
                            call.escalation),
                    hedge_of=call.placement, after_ms=elapsed_ms)
        owner = (call.placement, second)
        pending = {0, 1}
        while pending:
            finished: Finished = yield Await(None)
            pending.discard(finished.tag)
            result = self._settled(owner[finished.tag], req, finished, fallbacks, start)
            if result is not None:
                self._obs.hedged(second.node_id, "won" if finished.tag else "lost")
                for tag in pending:  # the loser: its answer is not needed any more
                    yield Cancel(tag)
                return result
        return None

    def _settled(self, placement: Placement, req: Request, finished: Finished,
                 fallbacks: list[Fallback], start: float) -> StepResult | None:
        if finished.error is not None:
            self._failed(placement, finished.error, fallbacks)
            return None
        return self._timed(placement, req, self._succeeded(placement, finished.result), start)

    def _timed(self, placement: Placement, req: Request, result: StepResult | None,
               start: float) -> StepResult | None:
        if result is not None and self._hedger is not None:
            self._hedger.observe(req.task, placement.node_id, (self._clock() - start) * 1000.0)
        return result

    def _try(self, call: Call, fallbacks: list[Fallback]
             ) -> Generator[Command, Any, StepResult | None]:
        try:
            result = yield call
        except TierlinkError as exc:
            self._failed(call.placement, exc, fallbacks)
            return None
        return self._succeeded(call.placement, result)

    def _succeeded(self, placement: Placement, result: StepResult | None) -> StepResult | None:
        if placement.kind == "remote":
            self._breakers.success(placement.node_id)
        return result

    def _failed(self, placement: Placement, exc: TierlinkError,
                fallbacks: list[Fallback]) -> None:
        # The caller's mistake (a 400): any other node would refuse it the same way, so
        # it goes back as it is. A split's tail is the exception: its payload is ours.
        if isinstance(exc, InvalidRequest) and not placement.cut:
            raise exc
        reason = reason_of(exc)
        self._fell_back(fallbacks, Fallback(placement.node_id, reason, exc.message[:200]))
        # A step that failed here before reaching the upstream (a split plan's head
        # refused by this node's scheduler) says nothing about the upstream's health,
        # nor does an upstream that refused what was sent to it (a claim this node may
        # not make, an input it may not hold) or shed an escalation it had no room for:
        # it is up and judging correctly.
        if placement.kind == "remote" and not exc.details.get("before_hop") \
                and not isinstance(exc, PeerRefused | PrivacyViolation | EscalationShed):
            self._breakers.failure(placement.node_id, reason)

    def _fell_back(self, fallbacks: list[Fallback], fallback: Fallback) -> None:
        fallbacks.append(fallback)
        self._obs.fell_back(fallback.node_id, fallback.reason)
        if tracing.enabled():
            tracing.mark("tierlink.fallback", {"tierlink.peer": fallback.node_id,
                                               "tierlink.reason": fallback.reason,
                                               "tierlink.detail": fallback.detail})

    def _retryable(self, last: Fallback, placement: Placement, remaining_ms: float) -> bool:
        return (last.reason == "unavailable" and remaining_ms > 4 * self._margin_ms
                and self._breakers.allow(placement.node_id) and self._budget.take())

    def _finish(self, result: StepResult, fallbacks: list[Fallback], escalations: int,
                spent: Bill, degraded: str) -> StepResult:
        up = result.outcome
        path = up.path if up.path and up.path[0] == self._node_id else (self._node_id, *up.path)
        outcome = replace(up, path=path, escalations=up.escalations + escalations,
                          fallbacks=(*fallbacks, *up.fallbacks), bill=up.bill + spent,
                          degraded=degraded or up.degraded)
        return StepResult(result.outputs, outcome)


# Why a placement failed when the fleet is busy rather than broken: out of time, refused
# for load, a breaker opened by timeouts, an upstream with no placement left in time.
_BUSY = frozenset({"timeout", "deadline", "refused", "breaker_open", "no_feasible_placement",
                   EscalationShed.code})


def _all_failed(req: Request, fallbacks: list[Fallback]) -> TierlinkError:
    """Every placement timed out: 504; each refused it for its privacy (an upstream's
    router or receipt): 403; each shed it as an escalation: 429; each was refused or out of
    time (overload): 503 with a retry hint; anything else (an upstream broke or answered
    garbage): 502."""
    tried = ", ".join(f"{f.node_id}: {f.reason}" for f in fallbacks) or "no placement"
    reasons = {f.reason for f in fallbacks}
    cls: type[TierlinkError] = UpstreamError
    extra: dict[str, Any] = {}
    if reasons == {PrivacyViolation.code}:
        cls = PrivacyViolation
    elif reasons == {EscalationShed.code}:  # the caller keeps the answer it holds
        cls = EscalationShed
    elif reasons and reasons <= {"timeout", "deadline"}:
        cls = DeadlineExceeded
    elif reasons and reasons <= _BUSY:
        cls, extra = Overloaded, {"retry_after_s": 1.0}
    return cls(f"request {req.request_id} for {req.task!r} failed on every placement ({tried})",
               fallbacks=[{"node": f.node_id, "reason": f.reason, "detail": f.detail}
                          for f in fallbacks], **extra)


async def execute_observed(dispatcher: Dispatcher, plan: Plan, req: Request, inputs: Inputs,
                           t0: float, clock: Callable[[], float],
                           observe: Callable[[StepResult | None, float], None]) -> StepResult:
    """``dispatcher.execute`` with the outcome (None: it failed) and the latency from ``t0``
    handed to ``observe`` (``node/steps.observed``)."""
    steps = dispatcher.steps(plan, req, inputs, t0 + req.deadline_ms / 1000.0)
    return await dispatcher.run(observed(steps, t0, clock, observe), req, inputs)
