"""Requests for one model run as one batch (``batching:`` in the fleet file, see
``settings/batching.py``): which runs may be batched, their key, and the batched call.

The scheduler decides which waiting jobs run together (``Scheduler._gather``); this module
makes their call: the requests' inputs stacked along the batch axis, one run, each request's
rows of every output handed back to it — the same outputs it would get alone.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from tierlink.models.runtime import ModelRuntime
from tierlink.node.job_queue import Batchable
from tierlink.settings.batching import BatchSettings

__all__ = ["Outputs", "batchable", "for_run", "run_together"]

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]
Inputs = dict[str, np.ndarray]


def batchable(rt: ModelRuntime) -> bool:
    """Every input and output of ``rt`` has a batch axis first (of any size), and it runs in
    this process (a runtime that waits on another one batches there, if anywhere)."""
    decls = (*rt.inputs, *rt.outputs)
    return (not getattr(rt, "remote", False) and bool(rt.inputs)
            and all(d.shape and d.shape[0] == -1 for d in decls))


def for_run(rt: ModelRuntime, inputs: Inputs, settings: BatchSettings | None,
            slowdown: float = 1.0) -> Batchable | None:
    """What lets this run join others of the same model version and input shapes, or None
    when the model is not batched."""
    if settings is None or not settings.on or not batchable(rt):
        return None
    shapes = ",".join(f"{name}:{arr.dtype.str}{arr.shape[1:]}"
                      for name, arr in sorted(inputs.items()))
    return Batchable(f"{rt.info.name}@{rt.info.version}|{shapes}", inputs,
                     run_together(rt, slowdown), settings.max_batch,
                     settings.max_delay_ms / 1000.0)


def run_together(rt: ModelRuntime, slowdown: float = 1.0
                 ) -> Callable[[Sequence[Inputs]], list[tuple[Outputs, float]]]:
    """The batched call: each request's outputs and its share of the run's time (ms, by
    its rows), as the unbatched call returns them."""

    def run(items: Sequence[Inputs]) -> list[tuple[Outputs, float]]:
        start = time.perf_counter()
        rows = [len(next(iter(item.values()))) for item in items]
        stacked = {name: np.concatenate([item[name] for item in items]) for name in items[0]}
        out = rt.infer(stacked)
        if slowdown > 1.0:
            time.sleep((slowdown - 1.0) * (time.perf_counter() - start))
        total_ms = (time.perf_counter() - start) * 1000.0
        if any(arr.ndim == 0 or arr.shape[0] != sum(rows) for arr in out.values()):
            log.warning("%s: an output has no batch axis; its requests run one by one",
                        rt.info.name)
            return [_alone(rt, item) for item in items]
        edges = list(itertools.accumulate(rows, initial=0))
        return [({name: arr[a:b] for name, arr in out.items()}, total_ms * (b - a) / edges[-1])
                for a, b in itertools.pairwise(edges)]

    return run


def _alone(rt: ModelRuntime, item: Inputs) -> tuple[Outputs, float]:
    start = time.perf_counter()
    out = rt.infer(item)
    return out, (time.perf_counter() - start) * 1000.0
