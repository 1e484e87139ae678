"""Shadow mode: a candidate policy decides beside the acting one on live traffic, without
acting; what both chose, the acting choice's propensity and the outcome are logged for
off-policy evaluation (``policy/ope.py``).

Both policies are judged over the *same* feasible options — the tierlink policy's hard
constraints (``TierlinkPolicy.feasible_choices``), from the acting policy when it is one and
from a ``frame`` tierlink policy otherwise. A policy that builds on the tierlink policy orders
those options (``order``); any other policy plans as it always does, and its plan's first
placement is matched to the feasible option that starts the same way (kind, tier, model,
split). A first placement no feasible option starts with (a plan the router would refuse, or
one past the deadline's worst case) is logged as ``outside:...`` with zero features: the
estimators value it at no reward.

The acting policy's first option is what the node does — except with probability
``explore``, when a uniformly drawn feasible option goes first instead (the share of traffic
that lets a log say anything about options the acting policy never takes). The propensity of
what went first is then ``(1 − explore)·[it is the acting choice] + explore / K`` over K
feasible options.

The candidate and the exploration draw from a generator of their own, so with
``explore = 0`` a node in shadow mode does exactly what it does without it (tested).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from tierlink.core.types import ClusterView, Placement, Plan, Request
from tierlink.policy.bandit import features
from tierlink.policy.base import Policy
from tierlink.policy.placement import Choice, TierlinkPolicy, placements


def arm(choice: Choice) -> str:
    """An option's name in a log: kind, the node that answers first, the model."""
    node = (choice.pick or choice.node).node_id
    model = choice.model.name if choice.model else choice.split_model
    return f"{choice.kind}:{node}:{model}" + (f":{choice.cut}" if choice.cut else "")


def _start(p: Placement) -> tuple[object, ...]:
    """How a plan starts, as far as shadow mode tells options apart: what kind of step, to
    which tier, which model when it runs here, which split, whether it may escalate."""
    return (p.kind, p.tier, p.model if p.kind == "local" else None, p.cut, p.codec,
            p.escalate_below is not None)


def matching(plan: Plan, feasible: list[Choice]) -> Choice | None:
    """The feasible option ``plan`` starts with; None when it starts with none of them."""
    if plan.empty:
        return None
    want = _start(plan.placements[0])
    return next((c for c in feasible if _start(placements(c)[0]) == want), None)


def outside(plan: Plan) -> str:
    """The log's name of a first step no feasible option takes (``refused``: no plan)."""
    if plan.empty:
        return "refused"
    p = plan.placements[0]
    return f"outside:{p.kind}:{p.node_id}:{p.model or ''}" + (f":{p.cut}" if p.cut else "")


@dataclass(frozen=True, slots=True)
class Decision:
    """One logged decision (the reward comes with the outcome)."""

    request_id: str
    arms: tuple[str, ...]
    acting: str  # what went first (after exploration)
    candidate: str  # what the candidate would have put first
    propensity: float  # P(acting | context) under the acting policy with exploration
    acting_features: tuple[float, ...]
    candidate_features: tuple[float, ...]


class Shadow:
    """One request in shadow mode: ``acting`` places it, ``candidate`` decides beside it
    (either any policy); ``frame`` gives the feasible options when ``acting`` is not a
    tierlink policy."""

    def __init__(self, acting: Policy, candidate: Policy, explore: float = 0.0,
                 rng: random.Random | None = None, frame: TierlinkPolicy | None = None
                 ) -> None:
        if not 0.0 <= explore <= 1.0:
            raise ValueError(f"the exploration share is in [0, 1], got {explore}")
        if not isinstance(acting, TierlinkPolicy) and frame is None:
            raise ValueError("shadow mode beside a policy that is not a tierlink policy "
                             "needs a frame (a tierlink policy) for the feasible options")
        self.acting, self.candidate = acting, candidate
        self.frame = acting if isinstance(acting, TierlinkPolicy) else frame
        self.explore = explore
        self.rng = rng or random.Random(0)

    def plan(self, request: Request, view: ClusterView, rng: random.Random
             ) -> tuple[Plan, Decision | None]:
        """What the node does (the acting policy's plan, or an explored option first) and
        the decision to log (None when nothing was feasible)."""
        frame = self.frame
        assert frame is not None
        feasible, why = frame.feasible_choices(request, view, rng)
        if not feasible:
            if frame is self.acting:
                return Plan((), frame.name, reason=why), None
            return self.acting.plan(request, view, rng), None
        plan, own, order = self._acting(request, view, feasible, rng)
        first = own
        if self.explore > 0 and self.rng.random() < self.explore:
            first = self.rng.choice(feasible)
            explored = frame.plan_from(request, view,
                                       [first, *(c for c in order if c is not first)])
            plan = explored if frame is self.acting else replace(explored,
                                                                  policy=self.acting.name)
        propensity = (1.0 - self.explore) * (first is own) + self.explore / len(feasible)
        ref = frame.reference_cost(request, view)
        zero = (0.0,) * len(features(request, feasible[0], ref))
        wanted, wanted_arm = self._candidate(request, view, feasible)
        decision = Decision(
            request.request_id, tuple(arm(c) for c in feasible),
            arm(first) if first is not None else outside(plan), wanted_arm, propensity,
            self._features(request, first, ref, zero),
            self._features(request, wanted, ref, zero))
        return plan, decision

    def _acting(self, request: Request, view: ClusterView, feasible: list[Choice],
                rng: random.Random) -> tuple[Plan, Choice | None, list[Choice]]:
        """The acting policy's plan, the feasible option it starts with, and the order an
        explored option's fallbacks follow."""
        acting, frame = self.acting, self.frame
        assert frame is not None
        if isinstance(acting, TierlinkPolicy):
            order = acting.order(request, view, feasible, rng)
            return acting.plan_from(request, view, order), order[0], order
        plan = acting.plan(request, view, rng)
        return plan, matching(plan, feasible), frame.ranked(request, view, feasible)

    def _candidate(self, request: Request, view: ClusterView, feasible: list[Choice]
                   ) -> tuple[Choice | None, str]:
        candidate = self.candidate
        if isinstance(candidate, TierlinkPolicy):
            ordered = candidate.order(request, view, feasible, self.rng)[0]
            return ordered, arm(ordered)
        plan = candidate.plan(request, view, self.rng)
        wanted = matching(plan, feasible)
        return wanted, arm(wanted) if wanted is not None else outside(plan)

    @staticmethod
    def _features(request: Request, choice: Choice | None, ref: float,
                  zero: tuple[float, ...]) -> tuple[float, ...]:
        if choice is None:
            return zero
        return tuple(float(x) for x in features(request, choice, ref))
