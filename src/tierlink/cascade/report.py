"""Tune a fleet's cascade on the calibration split and report it on the test split."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tierlink.cascade.guarantee import Guarantee, tune_guaranteed
from tierlink.cascade.records import cascade_records, record_to_dict
from tierlink.cascade.stages import Chain, build_stages
from tierlink.cascade.tune import Operating, Stage, Target, TargetKind, evaluate, single, tune
from tierlink.core.types import CascadeRecord
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.models.card import load_card
from tierlink.models.catalog import Resolved
from tierlink.models.data import Splits

# A guaranteed target, by default: "accuracy >= cloud-only - 0.3 point, with 95%
# probability" (of the expected accuracy; a batch size makes it a promise about any batch
# of that many requests, which costs more escalations).
DEFAULT_BATCH: int | None = None
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class Goal:
    """A target as a user states it. ``accuracy_drop``: points below the last (most
    accurate) stage alone; ``cost_share``: a fraction of the last stage's cost alone. The
    relative forms are resolved on the calibration split. ``confidence`` (accuracy
    targets only): the target must hold on unseen data with this probability, by a
    finite-sample test over the calibration records (``cascade/guarantee.py``); None
    takes the point estimate on the calibration split."""

    kind: str  # accuracy_drop | accuracy_floor | escalation_budget | cost_share | cost_ceiling
    value: float
    prefer: str = "device"  # for accuracy floors: fewest escalations ("device") or "cost"
    confidence: float | None = None
    batch: int | None = DEFAULT_BATCH  # the guarantee speaks of this many requests

    @property
    def guaranteed(self) -> bool:
        return self.confidence is not None and self.kind in ("accuracy_drop",
                                                              "accuracy_floor")

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
    guarantee: Guarantee | None = None
    # What each model does on the calibration inputs that reach it, by path (at the
    # chosen thresholds), and the sha256 of every model file of the chain: the
    # thresholds belong to exactly these models.
    records: dict[str, CascadeRecord] | None = None
    tuned_on: dict[str, str] | None = None

    def thresholds(self) -> dict[str, float]:
        """Model name -> threshold, for every stage but the last."""
        return dict(zip(self.chain.models, self.calib.thresholds, strict=False))

    def describe(self) -> str:
        """The target as a sentence (the guarantee and its bound when there is one)."""
        if self.guarantee is None:
            return self.target.describe()
        return f"{self.guarantee.describe()}, one confidence bar for every stage"

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
            "guarantee": None if self.guarantee is None else self.guarantee.to_dict(),
            "records": {k: record_to_dict(r) for k, r in (self.records or {}).items()},
            "tuned_on": dict(self.tuned_on or {}),
            "text": self.describe(),
        }


def tune_chain(models: Mapping[str, Resolved], chain: Chain, splits: Splits, goal: Goal,
               cost: CostModel = DEFAULT_COST_MODEL) -> TuneReport:
    """Tune on the calibration split, evaluate the same thresholds on the test split;
    ``models``: the chain's models as the catalog resolved them."""
    calib = build_stages(models, chain, splits.calib, cost)
    test = build_stages(models, chain, splits.test, cost)
    report = tune_stages(calib, test, chain, goal)
    return replace(report, tuned_on={m: load_card(models[m].card).sha256
                                     for m in chain.models})


def tune_stages(calib: list[Stage], test: list[Stage], chain: Chain, goal: Goal) -> TuneReport:
    """:func:`tune_chain` on stages already measured (benchmarks resample them)."""
    target = goal.resolve(calib)
    guarantee = None
    if goal.guaranteed:
        drop = goal.value / 100.0 if goal.kind == "accuracy_drop" else None
        floor = None if drop is not None else goal.value
        sure = tune_guaranteed(calib, goal.confidence or 0.0, drop=drop, floor=floor,
                               batch=goal.batch)
        chosen, feasible, guarantee = sure.chosen, sure.feasible, sure.guarantee
    else:
        tuned = tune(calib, target)
        chosen, feasible = tuned.chosen, tuned.feasible
    alone = {name: {m: single(stages, i) for i, m in enumerate(chain.models)}
             for name, stages in (("calib", calib), ("test", test))}
    records = cascade_records(calib, chosen.thresholds)
    return TuneReport(chain, goal, target, feasible, chosen, evaluate(test, chosen.thresholds),
                      alone, guarantee, records)
