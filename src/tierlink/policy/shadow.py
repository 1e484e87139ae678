"""Shadow mode: a candidate policy decides beside the acting one on live traffic, without
acting; what both chose, the acting choice's propensity and the outcome are logged for
off-policy evaluation (``policy/ope.py``).

Both policies order the *same* feasible options (the acting policy's hard constraints;
``TierlinkPolicy.feasible_choices``). The acting policy's first option is what the node
does — except with probability ``explore``, when a uniformly drawn feasible option goes first
instead (the share of traffic that lets a log say anything about options the acting policy
never takes). The propensity of what went first is then
``(1 − explore)·[it is the acting choice] + explore / K`` over K feasible options.

The candidate and the exploration draw from a generator of their own, so with
``explore = 0`` a node in shadow mode does exactly what it does without it (tested).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tierlink.core.types import ClusterView, Plan, Request
from tierlink.policy.bandit import features
from tierlink.policy.placement import Choice, TierlinkPolicy


def arm(choice: Choice) -> str:
    """An option's name in a log: kind, the node that answers first, the model."""
    node = (choice.pick or choice.node).node_id
    model = choice.model.name if choice.model else choice.split_model
    return f"{choice.kind}:{node}:{model}" + (f":{choice.cut}" if choice.cut else "")


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
    def __init__(self, acting: TierlinkPolicy, candidate: TierlinkPolicy,
                 explore: float = 0.0, rng: random.Random | None = None) -> None:
        if not 0.0 <= explore <= 1.0:
            raise ValueError(f"the exploration share is in [0, 1], got {explore}")
        self.acting, self.candidate = acting, candidate
        self.explore = explore
        self.rng = rng or random.Random(0)

    def plan(self, request: Request, view: ClusterView, rng: random.Random
             ) -> tuple[Plan, Decision | None]:
        """What the node does (the acting policy's plan, or an explored option first) and
        the decision to log (None when nothing was feasible)."""
        acting = self.acting
        feasible, why = acting.feasible_choices(request, view, rng)
        if not feasible:
            return Plan((), acting.name, reason=why), None
        order = acting.order(request, view, feasible, rng)
        own = first = order[0]
        if self.explore > 0 and self.rng.random() < self.explore:
            first = self.rng.choice(feasible)
            order = [first, *(c for c in order if c is not first)]
        propensity = (1.0 - self.explore) * (first is own) + self.explore / len(feasible)
        ref = acting.reference_cost(request, view)
        wanted = self.candidate.order(request, view, feasible, self.rng)[0]
        phi = tuple(float(x) for x in features(request, first, ref))
        decision = Decision(request.request_id, tuple(arm(c) for c in feasible), arm(first),
                            arm(wanted), propensity, phi,
                            tuple(float(x) for x in features(request, wanted, ref)))
        plan = acting.plan_from(request, view, order)
        return plan, decision
