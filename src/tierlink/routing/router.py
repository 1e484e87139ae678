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

from tierlink.core.types import ClusterView, Outcome, Plan, Request
from tierlink.errors import ConfigError
from tierlink.policy import REGISTRY, Policy, PolicyConfig, RewardWeights
from tierlink.policy.bandit import reward_of
from tierlink.policy.base import give_feedback
from tierlink.policy.ope import Logged
from tierlink.policy.placement import TierlinkPolicy
from tierlink.policy.shadow import Decision, Shadow
from tierlink.routing.desk import PolicyDesk

__all__ = ["Router", "ShadowRun", "shadow_candidate"]


@dataclass(frozen=True, slots=True)
class ShadowRun:
    """Shadow mode on one node: the candidate that decides beside the acting policy, the
    share of requests the acting policy explores, the generator of both draws, where each
    decision goes with its reward (``log``), and what the reward counts."""

    candidate: TierlinkPolicy
    explore: float
    rng: random.Random
    log: Callable[[Logged], None]
    reward: RewardWeights


def shadow_candidate(name: str, config: PolicyConfig,
                     options: Mapping[str, Any] | None = None,
                     where: str = "routing.shadow.policy") -> TierlinkPolicy:
    """The candidate policy of shadow mode, made as a node makes its policies; refused when
    it cannot order the tierlink policy's feasible options (what shadow mode compares)."""
    candidate = REGISTRY.create(name, config, options)
    if not isinstance(candidate, TierlinkPolicy):
        raise ConfigError(f"{where} {name!r} cannot run in shadow mode: it does not order "
                          "the tierlink policy's feasible options",
                          hint="a shadow candidate builds on the tierlink policy")
    return candidate


class Router:
    """The route of every request a node receives (live or simulated)."""

    def __init__(self, desk: PolicyDesk, rng: random.Random,
                 shadow: ShadowRun | None = None) -> None:
        self.desk, self.rng, self.shadow = desk, rng, shadow

    def arrive(self, req: Request) -> tuple[Policy, Request]:
        """The policy that places ``req`` and the request as received (marked where it
        is held beyond its privacy); refused (``InvalidRequest``, ``PrivacyViolation``,
        ``DeadlineExceeded``) where it may not be placed here."""
        policy = self.desk.for_request(req)
        return policy, self.desk.receive(req, policy)

    def plan(self, policy: Policy, req: Request, view: ClusterView
             ) -> tuple[Plan, Decision | None]:
        """The acting policy's plan; in shadow mode the candidate decides beside it on this
        node's own requests (an application's, not a forwarded one)."""
        run = self.shadow
        if run is None or req.hops > 0 or not isinstance(policy, TierlinkPolicy):
            return policy.plan(req, view, self.rng), None
        return Shadow(policy, run.candidate, run.explore, run.rng).plan(req, view, self.rng)

    def feedback(self, policy: Policy, plan: Plan, decision: Decision | None, req: Request,
                 view: ClusterView, outcome: Outcome | None, correct: float,
                 latency_ms: float) -> None:
        """After the answer (or its failure): a learning policy hears how its plan turned
        out, and a shadow decision is logged with the request's reward."""
        give_feedback(policy, plan, req, view, outcome, correct, latency_ms)
        if decision is None or self.shadow is None or not isinstance(policy, TierlinkPolicy):
            return
        reward = reward_of(self.shadow.reward, req, policy.reference_cost(req, view),
                           outcome, correct, latency_ms)
        self.shadow.log(Logged(decision.acting, decision.candidate, decision.propensity,
                               reward, decision.acting_features, decision.candidate_features))
