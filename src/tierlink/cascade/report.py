"""Tune a fleet's cascade on the calibration split and report it on the test split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tierlink.cascade.stages import Chain, build_stages
from tierlink.cascade.tune import Operating, Stage, Target, TargetKind, evaluate, single, tune
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.zoo.cache import Zoo
from tierlink.zoo.datasets import Splits


@dataclass(frozen=True, slots=True)
class Goal:
    """A target as a user states it. ``accuracy_drop``: points below the last (most
    accurate) stage alone; ``cost_share``: a fraction of the last stage's cost alone. The
    relative forms are resolved on the calibration split."""

    kind: str  # accuracy_drop | accuracy_floor | escalation_budget | cost_share | cost_ceiling
    value: float
    prefer: str = "device"  # for accuracy floors: fewest escalations ("device") or "cost"

    def resolve(self, stages: list[Stage]) -> Target:
        top = single(stages, len(stages) - 1)
        if self.kind == "accuracy_drop":
            return Target(TargetKind.ACCURACY_FLOOR, top.accuracy - self.value / 100.0,
                          self.prefer)
        if self.kind == "accuracy_floor":
            return Target(TargetKind.ACCURACY_FLOOR, self.value, self.prefer)
        if self.kind == "escalation_budget":
            return Target(TargetKind.ESCALATION_BUDGET, self.value)
        if self.kind == "cost_share":
            return Target(TargetKind.COST_CEILING, self.value * top.cost)
        if self.kind == "cost_ceiling":
            return Target(TargetKind.COST_CEILING, self.value)
        raise ConfigError(f"unknown cascade target {self.kind!r}",
                          hint="use accuracy_drop, accuracy_floor, escalation_budget, "
                               "cost_share or cost_ceiling")


@dataclass(frozen=True, slots=True)
class TuneReport:
    """Thresholds chosen on ``calib`` for ``target``, and what they do on ``test``;
    ``alone``: each stage answering everything itself, per split."""

    chain: Chain
    goal: Goal
    target: Target
    feasible: bool
    calib: Operating
    test: Operating
    alone: dict[str, dict[str, Operating]]

    def thresholds(self) -> dict[str, float]:
        """Model name -> threshold, for every stage but the last."""
        return dict(zip(self.chain.models, self.calib.thresholds, strict=False))

    def to_dict(self) -> dict[str, Any]:
        return {
            "chain": [{"model": m, "tier": t.label}
                      for m, t in zip(self.chain.models, self.chain.tiers, strict=True)],
            "goal": {"kind": self.goal.kind, "value": self.goal.value,
                     "prefer": self.goal.prefer},
            "target": {"kind": self.target.kind.value, "value": self.target.value,
                       "text": self.target.describe()},
            "feasible": self.feasible, "thresholds": self.thresholds(),
            "calib": self.calib.to_dict(), "test": self.test.to_dict(),
            "alone": {split: {m: op.to_dict() for m, op in ops.items()}
                      for split, ops in self.alone.items()},
        }


def tune_chain(zoo: Zoo, chain: Chain, splits: Splits, goal: Goal,
               cost: CostModel = DEFAULT_COST_MODEL) -> TuneReport:
    """Tune on the calibration split, evaluate the same thresholds on the test split."""
    calib = build_stages(zoo, chain, splits.calib, cost)
    test = build_stages(zoo, chain, splits.test, cost)
    target = goal.resolve(calib)
    tuned = tune(calib, target)
    alone = {name: {m: single(stages, i) for i, m in enumerate(chain.models)}
             for name, stages in (("calib", calib), ("test", test))}
    return TuneReport(chain, goal, target, tuned.feasible, tuned.chosen,
                      evaluate(test, tuned.chosen.thresholds), alone)
