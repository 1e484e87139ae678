"""Cascade stages of imported models: the chain checked (one data set, every model
cascadable), then :func:`~tierlink.cascade.stages.build_stages` on the calibration and
evaluation parts of the data they were imported with. What ``cascade tune`` needs for a
chain of users' models."""

from __future__ import annotations

from dataclasses import dataclass

from tierlink.cascade.stages import Chain, build_stages
from tierlink.cascade.tune import Stage
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.models.catalog import Resolved
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
    data_of = {m: c.data.sha256 if c.data else "" for m, c in cards.items()}
    if len(set(data_of.values())) != 1:
        raise ConfigError(f"the chain {list(chain.models)} was imported with different data "
                          f"({ {m: d[:12] for m, d in data_of.items()} })",
                          hint="import every model of a task with the same --data, so a "
                               "cascade is tuned on the same inputs at every stage")
    for m, c in cards.items():
        if not c.cascadable:
            raise ConfigError(f"{m} cannot be cascaded: its {c.kind} task gives no "
                              "confidence or no per-sample correctness",
                              hint="declare an uncertainty output (regression, embedding) or "
                                   "a tolerance option; or place it without a cascade")
    parts = store.splits(chain.models[0])
    found = {m: Resolved(m, *store.paths(m), source="store") for m in chain.models}
    return ImportedStages(build_stages(found, chain, parts.calib, cost),
                          build_stages(found, chain, parts.test, cost),
                          {m: c.sha256 for m, c in cards.items()})
