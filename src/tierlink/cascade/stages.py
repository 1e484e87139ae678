"""Cascade stages from real classifiers the catalog resolved: calibrated confidence and
correctness on a split, and the cost of a request reaching each tier under the fleet's
cost model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tierlink.cascade.tune import Stage
from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.models.card import load_card
from tierlink.models.catalog import Resolved
from tierlink.models.data import Labelled


@dataclass(frozen=True, slots=True)
class Chain:
    """The models a request can meet, in order (device first), with their tiers."""

    models: tuple[str, ...]
    tiers: tuple[Tier, ...]


def stage_cost(tier: Tier, latency_ms: float, input_bytes: int,
               cost: CostModel = DEFAULT_COST_MODEL) -> float:
    """USD for one request that reaches ``tier``: the model's compute time at that tier's
    price plus moving the input into the tier (the WAN into the cloud is not free)."""
    return cost.compute(tier, latency_ms) + cost.transfer(tier, input_bytes)


def build_stages(models: Mapping[str, Resolved], chain: Chain, split: Labelled,
                 cost: CostModel = DEFAULT_COST_MODEL, threads: int = 1) -> list[Stage]:
    """One :class:`Stage` per model of ``chain`` on ``split``, confidence calibrated with
    each model's own temperature (from its card)."""
    from tierlink.models.evaluate import onnx_logits, softmax

    if len(chain.models) != len(chain.tiers):
        raise ConfigError("a cascade chain needs one tier per model")
    input_bytes = int(np.prod(split.input.shape[1:])) * 4  # FP32 on the wire
    stages = []
    for name, tier in zip(chain.models, chain.tiers, strict=True):
        card = load_card(models[name].card)
        probs = softmax(onnx_logits(models[name].file, split.input, threads=threads),
                        card.temperature)
        stages.append(Stage(
            model=name, tier=tier, confidence=probs.max(axis=1),
            correct=probs.argmax(axis=1) == split.labels,
            cost=stage_cost(tier, card.latency_ms["batch1_p50"], input_bytes, cost)))
    return stages


def chain_from_fleet(models_by_tier: Sequence[tuple[Tier, Sequence[str]]], task: str,
                     task_of: Callable[[str], str | None] | None = None) -> Chain:
    """The cascade a fleet runs for ``task``: the first model of the task on each tier that
    serves one, device first. ``models_by_tier``: (tier, models) per node, in file order.
    ``task_of``: a model's task (default: zoo names, ``<task>-<size>``)."""
    def of(name: str) -> str | None:
        found = task_of(name) if task_of else None
        return found if found is not None else (task if name.startswith(f"{task}-") else None)

    picked: dict[Tier, str] = {}
    for tier, models in models_by_tier:
        for name in models:
            if of(name) == task and tier not in picked:
                picked[tier] = name
    order = sorted(picked)
    if len(order) < 2:
        raise ConfigError(f"the fleet serves task {task!r} on {len(order)} tier(s); a "
                          "cascade needs at least two",
                          hint="put a model of the task on devices and on an upstream tier")
    return Chain(tuple(picked[t] for t in order), tuple(order))
