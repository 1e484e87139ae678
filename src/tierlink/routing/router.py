"""One request's route (see the package docstring): arrival, plan, feedback.

Pure of I/O: what a shadow decision's log line becomes (a node's ``shadow.jsonl``, the
simulator's list) and what a receipt's verdict is counted as (a metric, a counter) are
injected; randomness comes from the generator the caller owns.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tierlink.core.types import ClusterView, Outcome, Placement, Plan, Privacy, Request
from tierlink.errors import PrivacyViolation
from tierlink.policy import REGISTRY, Policy, PolicyConfig, RewardWeights
from tierlink.policy.bandit import reward_of
from tierlink.policy.base import give_feedback
from tierlink.policy.ope import Logged
from tierlink.policy.placement import TierlinkPolicy
from tierlink.policy.shadow import Decision, Shadow
from tierlink.routing.desk import PolicyDesk
from tierlink.routing.privacy import may_hold

__all__ = ["Router", "ShadowRun", "shadow_run"]

Refusal = Callable[[str, str], None]  # (privacy level, policy) of a plan refused


def _unheard(_privacy: str, _policy: str) -> None:
    pass


@dataclass(frozen=True, slots=True)
class ShadowRun:
    """Shadow mode on one node: the candidate that decides beside the acting policy (any
    policy), the share of requests the acting policy explores, the generator of both draws,
    where each decision goes with its reward (``log``), what the reward counts, and the
    tierlink policy whose feasible options both are judged over when the acting policy is
    not one (``frame``)."""

    candidate: Policy
    explore: float
    rng: random.Random
    log: Callable[[Logged], None]
    reward: RewardWeights
    frame: TierlinkPolicy


def shadow_run(name: str, config: PolicyConfig, options: Mapping[str, Any] | None,
               explore: float, rng: random.Random, log: Callable[[Logged], None],
               reward: RewardWeights) -> ShadowRun:
    """Shadow mode as a node runs it: the candidate made as a node makes its policies (with
    its options), the frame a tierlink policy of the same configuration."""
    return ShadowRun(REGISTRY.create(name, config, options), explore, rng, log, reward,
                     TierlinkPolicy(config))


class Router:
    """The route of every request a node receives (live or simulated). Privacy is the
    router's, not the policy's: a plan that would move an input further than its privacy
    level allows is refused (``PrivacyViolation``), counted (``refused``) and never run,
    whatever policy made it."""

    def __init__(self, desk: PolicyDesk, rng: random.Random,
                 shadow: ShadowRun | None = None, refused: Refusal = _unheard,
                 revision: int = 0) -> None:
        self.desk, self.rng, self.shadow = desk, rng, shadow
        self._refused = refused
        self.revision = revision  # the fleet routing revision it was made from

    def arrive(self, req: Request) -> tuple[Policy, Request]:
        """The policy that places ``req``; refused (``InvalidRequest``, ``PrivacyViolation``,
        ``DeadlineExceeded``) where it may not be placed here."""
        policy = self.desk.for_request(req)
        return policy, self.desk.receive(req, policy)

    def plan(self, policy: Policy, req: Request, view: ClusterView
             ) -> tuple[Plan, Decision | None]:
        """The acting policy's plan, admitted; in shadow mode the candidate decides beside
        it on this node's own requests (an application's, not a forwarded one)."""
        run = self.shadow
        if run is None or req.hops > 0:
            plan, decision = policy.plan(req, view, self.rng), None
        else:
            plan, decision = Shadow(policy, run.candidate, run.explore, run.rng,
                                    run.frame).plan(req, view, self.rng)
        return self.admit(req, plan), decision

    def admit(self, req: Request, plan: Plan) -> Plan:
        """``plan`` when every placement keeps ``req``'s input (or a split's features)
        where its privacy level allows; refused and counted otherwise."""
        for placement in plan.placements:
            if placement.node_id != self.desk.node_id and not self._may_go(req, placement):
                self._refused(req.privacy.value, plan.policy)
                what = "features" if placement.cut else "input"
                raise PrivacyViolation(
                    f"policy {plan.policy!r} planned to send a {req.privacy.value!r} "
                    f"request's {what} to {placement.node_id} ({placement.tier.label}); "
                    "refused", hint=self._hint(req, placement),
                    request_id=req.request_id, policy=plan.policy)
        return plan

    def _may_go(self, req: Request, placement: Placement) -> bool:
        if placement.cut:
            return req.privacy.features_allowed(
                placement.tier, local_may_leave=self.desk.local_features_may_leave)
        return may_hold(req.privacy, placement.tier, placement.node_id,
                        req.origin or self.desk.node_id)

    @staticmethod
    def _hint(req: Request, placement: Placement) -> str:
        if placement.cut and req.privacy is Privacy.LOCAL:
            return ("set routing.local_features_may_leave: true to allow split plans for "
                    "local requests")
        return "privacy is a hard constraint: a policy plans within it"

    def feedback(self, policy: Policy, plan: Plan, decision: Decision | None, req: Request,
                 view: ClusterView, outcome: Outcome | None, correct: float,
                 latency_ms: float) -> None:
        """After the answer (or its failure): a learning policy hears how its plan turned
        out, and a shadow decision is logged with the request's reward."""
        give_feedback(policy, plan, req, view, outcome, correct, latency_ms)
        run = self.shadow
        if decision is None or run is None:
            return
        frame = policy if isinstance(policy, TierlinkPolicy) else run.frame
        reward = reward_of(run.reward, req, frame.reference_cost(req, view), outcome,
                           correct, latency_ms)
        run.log(Logged(decision.acting, decision.candidate, decision.propensity, reward,
                       decision.acting_features, decision.candidate_features))
