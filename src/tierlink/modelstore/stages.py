"""Cascade stages of imported models: each model of a chain run on the calibration and
evaluation parts of the data it was imported with, confidence and correctness read by its
task's output kind. What ``cascade tune`` needs for a chain of users' models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tierlink.cascade.stages import Chain, stage_cost
from tierlink.cascade.tune import Stage
from tierlink.errors import ConfigError, ImportRefused
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.models import runtimes
from tierlink.models.data import split
from tierlink.models.evaluate import feed, run
from tierlink.models.kind_registry import kind_of
from tierlink.models.runtimes import LoadSpec
from tierlink.models.task import task_from_dict
from tierlink.models.tensors import NP_TYPES
from tierlink.modelstore.store import ModelStore


@dataclass(frozen=True, slots=True)
class ImportedStages:
    calib: list[Stage]
    eval: list[Stage]
    tuned_on: dict[str, str]  # model -> sha256 of its file


def imported_stages(store: ModelStore, chain: Chain,
                    cost: CostModel = DEFAULT_COST_MODEL) -> ImportedStages:
    """Refuses a chain whose models cannot be cascaded (no confidence, or no per-sample
    correctness for their kind) or were measured on different data."""
    cards = {m: store.card(m) for m in chain.models}
    data_of = {m: c["data"]["sha256"] for m, c in cards.items()}
    if len(set(data_of.values())) != 1:
        raise ConfigError(f"the chain {list(chain.models)} was imported with different data "
                          f"({ {m: d[:12] for m, d in data_of.items()} })",
                          hint="import every model of a task with the same --data, so a "
                               "cascade is tuned on the same inputs at every stage")
    for m, c in cards.items():
        if not c.get("cascadable"):
            raise ConfigError(f"{m} cannot be cascaded: its {c['kind']} task gives no "
                              "confidence or no per-sample correctness",
                              hint="declare an uncertainty output (regression, embedding) or "
                                   "a tolerance option; or place it without a cascade")
    first = cards[chain.models[0]]
    data = store.load_data(first["data"]["sha256"])
    parts = split(data, float(first["data"]["calib_share"]), int(first["data"]["seed"]))
    per_model = [_stage_pair(store, m, t, cards[m], parts, cost)
                 for m, t in zip(chain.models, chain.tiers, strict=True)]
    return ImportedStages([p[0] for p in per_model], [p[1] for p in per_model],
                          {m: c["sha256"] for m, c in cards.items()})


def _stage_pair(store: ModelStore, name: str, tier: Any, card: dict[str, Any], parts: Any,
                cost: CostModel) -> tuple[Stage, Stage]:
    model_file, card_path = store.paths(name)
    rt = runtimes.load(LoadSpec(card=card_path, model_file=model_file))
    inputs = rt.inputs
    task = task_from_dict(card["task"], card["task_spec"], "card")
    kind = kind_of(task.kind)
    input_bytes = sum(int(np.prod(i.shape[1:])) * np.dtype(NP_TYPES[i.datatype]).itemsize
                      for i in inputs if all(d > 0 for d in i.shape[1:]))
    price = stage_cost(tier, float(card["latency_ms"]["batch1_p50"]), input_bytes, cost)
    out = []
    for part in (parts.calib, parts.test):
        answer = kind.answer(run(rt, feed(part.inputs, inputs)), task,
                             float(card["temperature"]))
        correct = kind.correct(answer, part.labels, task)
        if answer.confidence is None:  # checked by the caller: such kinds are not cascaded
            raise ImportRefused(f"{name}: its kind gives no confidence to cascade on")
        out.append(Stage(model=name, tier=tier, confidence=answer.confidence,
                         correct=np.asarray(correct, bool), cost=price))
    return out[0], out[1]
