"""Learned scheduling: a contextual bandit (linear Thompson sampling) choosing among the
options the hard constraints leave.

The constraints are the ``tierlink`` policy's, unchanged (privacy, models, health, the
deadline's worst case): the learner never sees an infeasible option. Each feasible option
is described by features of the request and of the option as the estimators price it
(expected and worst latency over the deadline, expected accuracy, cost over the fleet's
dearest, its kind and tier, the target's queue); a Bayesian linear model of the reward over
those features is sampled once per decision and the option with the best sampled reward
goes first, the ``tierlink`` ranking after it as fallbacks. The prior's mean is the
``tierlink`` score itself, so an untrained bandit decides as ``tierlink`` does (with the
prior's spread as exploration) and learns the corrections its reward asks for.

Feedback: the node hands back the plan (its ``features``) with the request's reward,
``w_accuracy·correct − w_latency·latency/deadline − w_miss·[late] − w_cost·cost/ref
− w_energy·device-seconds − w_privacy·[left the device]`` (:class:`RewardWeights`, from the
fleet file's ``routing.bandit.reward``); ``correct`` is the label's verdict when the request
carries one, else the answer's calibrated confidence (its expected correctness). The model
forgets geometrically (``forgetting`` per update), so it follows conditions that shift.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from tierlink.core.types import ClusterView, Outcome, Plan, Priority, Privacy, Request, Tier
from tierlink.errors import ConfigError
from tierlink.policy.base import PolicyConfig, RewardWeights
from tierlink.policy.placement import Choice, TierlinkPolicy, merge_placements

if TYPE_CHECKING:  # numpy is imported where it computes: `import tierlink.policy` stays light
    import numpy as np

KINDS = ("local", "cascade", "remote", "split")
FEATURES = ("bias", "latency", "worst", "accuracy", "cost", *(f"kind:{k}" for k in KINDS),
            "tier:edge", "tier:cloud", *(f"privacy:{p.value}" for p in Privacy),
            *(f"priority:{p.label}" for p in Priority), "queue")


def features(request: Request, choice: Choice, ref_cost: float) -> np.ndarray:
    import numpy as np

    deadline = max(request.deadline_ms, 1e-9)
    node = choice.pick or choice.node  # the node that answers first
    tier = node.tier
    return np.array([
        1.0, min(choice.est.latency_ms / deadline, 2.0), min(choice.est.worst_ms / deadline, 2.0),
        choice.est.accuracy, choice.est.cost / ref_cost if ref_cost > 0 else 0.0,
        *(float(choice.kind == k) for k in KINDS),
        float(tier is Tier.EDGE), float(tier is Tier.CLOUD),
        *(float(request.privacy is p) for p in Privacy),
        *(float(request.priority is p) for p in Priority),
        min((node.queue_depth + node.inflight) / max(node.workers, 1), 10.0) / 10.0])


def prior_mean(w: RewardWeights) -> np.ndarray:
    """The reward a ``tierlink``-like valuation expects: accuracy right, latency and cost
    as they cost (the rest learned)."""
    import numpy as np

    theta = np.zeros(len(FEATURES))
    theta[FEATURES.index("latency")] = -w.latency
    theta[FEATURES.index("accuracy")] = w.accuracy
    theta[FEATURES.index("cost")] = -w.cost
    return theta


NOISE = 0.1  # the reward noise the model assumes (an option: ``noise``): 0.1 explores
# enough to find out a card that lies, and no more (benchmarks/bandit.py: 0.1 did better than
# 0.3 in all three of its scenarios)


class LinearTS:
    """Bayesian linear regression of the reward with geometric forgetting; Thompson samples.

    Precision ``A`` = forgetting-weighted ``Σ φφᵀ`` + the prior's ``λI`` (forgotten evidence
    falls back to the prior, never to nothing); mean = ``A⁻¹b``."""

    def __init__(self, prior_mean: np.ndarray, prior_weight: float = 20.0,
                 noise: float = NOISE, forgetting: float = 0.999) -> None:
        import numpy as np

        d = prior_mean.shape[0]
        self.prior = prior_weight * np.eye(d)
        self.prior_b = self.prior @ prior_mean
        self.A = self.prior.copy()
        self.b = self.prior_b.copy()
        self.noise = noise
        self.forgetting = forgetting
        self.updates = 0
        self._cache: tuple[np.ndarray, np.ndarray] | None = None

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, Cholesky factor of the covariance)."""
        import numpy as np

        if self._cache is None:
            cov = np.linalg.inv(self.A)
            self._cache = cov @ self.b, np.linalg.cholesky(self.noise ** 2 * cov
                                                           + 1e-12 * np.eye(len(self.b)))
        return self._cache

    def sample(self, rng: random.Random) -> np.ndarray:
        import numpy as np

        mean, chol = self.posterior()
        z = np.array([rng.gauss(0.0, 1.0) for _ in range(mean.shape[0])])
        return mean + chol @ z

    def update(self, phi: np.ndarray, reward: float) -> None:
        import numpy as np

        g = self.forgetting
        self.A = g * self.A + (1.0 - g) * self.prior + np.outer(phi, phi)
        self.b = g * self.b + (1.0 - g) * self.prior_b + reward * phi
        self.updates += 1
        self._cache = None


class BanditPolicy(TierlinkPolicy):
    """Registered as ``"bandit"``; ``observe(plan, reward)`` teaches it. Its options
    (``routing.policy: {name: bandit, options: {prior_weight: 20, noise: 0.1}}``): how many
    requests' worth of belief its prior (the tierlink policy's scoring) carries before
    outcomes outweigh it, and the reward's noise the model assumes (σ: the width of its
    posterior, so how far its Thompson samples stray — how much it explores)."""

    name = "bandit"

    def __init__(self, config: PolicyConfig, weights: RewardWeights | None = None,
                 model: LinearTS | None = None, *, prior_weight: float = 20.0,
                 noise: float = NOISE) -> None:
        super().__init__(config)
        _check_option("prior_weight", prior_weight, 1e6, "e.g. 20: the prior counts as "
                                                         "twenty requests")
        _check_option("noise", noise, 10.0, "e.g. 0.1; larger explores more")
        self.rewards = weights or config.reward
        self.model = model or LinearTS(prior_mean(self.rewards), float(prior_weight),
                                       float(noise))

    def feedback(self, plan: Plan, request: Request, view: ClusterView,
                 outcome: Outcome | None, correct: float, latency_ms: float) -> None:
        """The request's reward (:func:`reward_of`) taught to the model (a
        :class:`~tierlink.policy.base.Learner`); a plan it did not score teaches nothing."""
        if plan.features:
            self.observe(plan, reward_of(self.rewards, request,
                                         self.reference_cost(request, view), outcome,
                                         correct, latency_ms))

    def plan_from(self, request: Request, view: ClusterView, order: list[Choice]) -> Plan:
        ref = self.reference_cost(request, view)
        return Plan(merge_placements(order), self.name, reason=f"bandit:{order[0].label}",
                    features=tuple(float(x) for x in features(request, order[0], ref)))

    def order(self, request: Request, view: ClusterView, feasible: list[Choice],
              rng: random.Random) -> list[Choice]:
        """The option with the best sampled reward first, ``tierlink``'s order after it."""
        ranked = self.ranked(request, view, feasible)
        ref = self.reference_cost(request, view)
        theta = self.model.sample(rng)
        chosen = max(feasible, key=lambda c: float(features(request, c, ref) @ theta))
        return [chosen, *(c for c in ranked if c is not chosen)]

    def observe(self, plan: Plan, reward: float) -> None:
        """The reward of a request this policy planned (``plan`` as it returned it)."""
        import numpy as np

        if plan.features and math.isfinite(reward):
            self.model.update(np.asarray(plan.features), reward)


def _check_option(name: str, value: object, most: float, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= most:
        raise ConfigError(f"routing.policy.options.{name} must be a number in (0, {most:g}], "
                          f"got {value!r}", hint=hint)


def reward_of(weights: RewardWeights, request: Request, ref_cost: float,
              outcome: Outcome | None, correct: float, latency_ms: float) -> float:
    """One request's reward (``outcome`` None: it failed — nothing right, the deadline
    missed by a deadline)."""
    if outcome is None:
        correct, latency_ms = 0.0, max(latency_ms, 2.0 * request.deadline_ms)
    return weights.reward(correct, latency_ms, request.deadline_ms,
                          outcome.cost if outcome else 0.0, ref_cost,
                          left_device=outcome is not None and outcome.served_by != request.origin)
