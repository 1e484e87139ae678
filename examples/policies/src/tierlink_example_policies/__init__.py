"""A placement policy written outside tierlink: the cheapest option that is accurate enough,
with each model's accuracy learned from the answers it gives.

It reuses tierlink's constraints by subclassing :class:`~tierlink.policy.placement.
TierlinkPolicy` and overriding only :meth:`order`: the feasible options it is handed have
already passed privacy, health, hop and deadline checks, and each upstream option is already
the power-of-two choice among that tier's nodes. Its options come from the fleet file::

    routing:
      policy: {name: cheapest_accurate, options: {max_drop: 0.5, min_samples: 50}}

and it is a :class:`~tierlink.policy.Learner`: the node hands every plan it made back with
how right its answer was, and the policy replaces a model's card accuracy with what it saw
once it has ``min_samples`` answers of it.
"""

from __future__ import annotations

import random

from tierlink.core.types import ClusterView, Outcome, Plan, Request
from tierlink.errors import ConfigError
from tierlink.policy import PolicyConfig
from tierlink.policy.placement import Choice, TierlinkPolicy

__all__ = ["CheapestAccurate"]


class CheapestAccurate(TierlinkPolicy):
    """Among the feasible options, the cheapest (then the fastest) whose accuracy is within
    ``max_drop`` points of the most accurate one; the others stay as fallbacks. A local
    option's accuracy is learned (see :meth:`accuracy`); an upstream's is its estimate."""

    name = "cheapest_accurate"

    def __init__(self, config: PolicyConfig, *, max_drop: float = 1.0,
                 min_samples: int = 50) -> None:
        super().__init__(config)
        if isinstance(max_drop, bool) or not isinstance(max_drop, (int, float)) \
                or not 0 <= max_drop <= 100:
            raise ConfigError(f"routing.policy.options.max_drop must be points in [0, 100], "
                              f"got {max_drop!r}")
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
            raise ConfigError(f"routing.policy.options.min_samples must be an integer >= 1, "
                              f"got {min_samples!r}")
        self.max_drop = float(max_drop) / 100.0
        self.min_samples = min_samples
        self.seen: dict[str, list[float]] = {}  # model -> [correctness summed, answers]

    def order(self, request: Request, view: ClusterView, feasible: list[Choice],
              rng: random.Random) -> list[Choice]:
        accuracy = [self.accuracy(c) for c in feasible]
        best = max(accuracy)
        good = [c for c, a in zip(feasible, accuracy, strict=True) if a >= best - self.max_drop]
        good.sort(key=lambda c: (c.est.cost, c.est.latency_ms))
        return good + [c for c in feasible if c not in good]

    def accuracy(self, choice: Choice) -> float:
        """The option's expected accuracy: what its model was seen to do here, once seen
        often enough; else the estimate (its card, or the cascade's record)."""
        if choice.kind == "local" and choice.model is not None:
            right, seen = self.seen.get(choice.model.name, (0.0, 0.0))
            if seen >= self.min_samples:
                return right / seen
        return choice.est.accuracy

    def feedback(self, plan: Plan, request: Request, view: ClusterView,
                 outcome: Outcome | None, correct: float, latency_ms: float) -> None:
        """Add the answer to its model's tally: ``correct`` is the share of the request's
        labels it met (its calibrated confidence when the request carried none)."""
        if outcome is None or outcome.served_by != view.self_id:
            return  # only what this node's own models answered
        tally = self.seen.setdefault(outcome.model, [0.0, 0.0])
        tally[0] += correct
        tally[1] += 1.0
