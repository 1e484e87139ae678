"""Cascade stages from real models the catalog resolved — the zoo's, users' imported ONNX
graphs or Python models alike: calibrated confidence and per-sample correctness on a split
(read by each task's output kind), and the cost of a request reaching each tier under the
fleet's cost model.

A model's raw outputs on a split are kept under ``$TIERLINK_HOME/cache/outputs``, named by
the sha256 of the model's file and of the split's inputs: tuning again for another target
(``tierlink cascade tune --accuracy-drop ... --no-write``) reads them instead of running
every model over the data again. A changed model or split has another name."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierlink.cascade.tune import Stage
from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.models import runtimes
from tierlink.models.catalog import Resolved
from tierlink.models.data import Labelled
from tierlink.models.evaluate import feed, run
from tierlink.models.home import tierlink_home
from tierlink.models.kind_registry import kind_of
from tierlink.models.runtimes import LoadSpec
from tierlink.models.tensors import NP_TYPES, TensorDecl


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
    """One :class:`Stage` per model of ``chain`` on ``split``: each model run by the runtime
    its card's format names (an ONNX graph, a user's Python model ...), its answers read by
    its task's output kind with its own temperature — the confidence and per-sample
    correctness a cascade is tuned on — and the cost of a request reaching its tier.
    ``models``: the chain's models as the catalog (or a store) resolved them."""
    if len(chain.models) != len(chain.tiers):
        raise ConfigError("a cascade chain needs one tier per model")
    return [_stage(models[name], tier, split, cost, threads)
            for name, tier in zip(chain.models, chain.tiers, strict=True)]


def _stage(found: Resolved, tier: Tier, split: Labelled, cost: CostModel,
           threads: int) -> Stage:
    rt = runtimes.load(LoadSpec(card=found.card, model_file=found.file, threads=threads))
    spec = rt.info.spec_for(rt.outputs)
    kind = kind_of(spec.kind)
    answer = kind.answer(_outputs(found, rt, split), spec, rt.info.temperature)
    correct = kind.correct(answer, split.labels, spec)
    if answer.confidence is None or correct is None:
        raise ConfigError(f"{found.name} cannot be a cascade stage: its {spec.kind} task gives "
                          "no confidence or no per-sample correctness",
                          hint="declare an uncertainty output (regression, embedding) or a "
                               "tolerance option; or place it without a cascade")
    return Stage(model=found.name, tier=tier, confidence=answer.confidence,
                 correct=np.asarray(correct, dtype=bool),
                 cost=stage_cost(tier, rt.info.latency_ms, _input_bytes(rt.inputs), cost))


def _outputs(found: Resolved, rt: Any, split: Labelled) -> dict[str, np.ndarray]:
    """``rt``'s raw outputs on ``split``: kept on disk by the model's and the inputs' sha256
    (see the module); a cache that cannot be read or written is run past."""
    digest = hashlib.sha256(found.file.read_bytes())
    for name in sorted(split.inputs):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(split.inputs[name]).tobytes())
    path = tierlink_home() / "cache" / "outputs" / f"{digest.hexdigest()}.npz"
    try:
        with np.load(path) as kept:
            return {k: kept[k] for k in kept.files}
    except (OSError, ValueError):
        pass
    out = run(rt, feed(split.inputs, rt.inputs))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **out)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except OSError:
        pass
    return dict(out)


def _input_bytes(inputs: Sequence[TensorDecl]) -> int:
    """Bytes of one request's inputs on the wire (the fixed-size ones)."""
    return sum(int(np.prod(i.shape[1:])) * np.dtype(NP_TYPES[i.datatype]).itemsize
               for i in inputs if all(d > 0 for d in i.shape[1:]))


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
