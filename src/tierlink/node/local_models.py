"""This node's own models, run: the dispatcher's local step of a plan, and a model a client
names directly (``/v2/models/{model}/infer``, unrouted) — on the scheduler's workers, with
their compute metrics, the versions' statistics and what each answer cost here.

A request runs on the version it pins, else on the canary for the canary's share
(:meth:`ModelManager.pick`); fault injection (tests, benchmarks) slows every run down as a
slow CPU would.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import numpy as np

from tierlink.core.types import Outcome, Placement, Priority, Request
from tierlink.errors import InvalidRequest, ModelNotFound, RuntimeFailure, TierlinkError
from tierlink.estimate.cost import CostModel
from tierlink.models.runtime import ModelRuntime, read_answer
from tierlink.node.compute import run_model
from tierlink.node.dispatcher import StepResult
from tierlink.node.forwarding import LABELS
from tierlink.node.models import ModelManager
from tierlink.node.scheduler import Scheduler
from tierlink.node.spec import NodeSpec
from tierlink.node.version_stats import VersionStatsBook
from tierlink.telemetry.metrics import NodeMetrics

log = logging.getLogger(__name__)


class LocalModels:
    """Runs this node's models. ``prices``: the cost model priced now (the node's snapshot's
    hour); ``tasks``: the tasks the fleet routes (named when a model is not served)."""

    def __init__(self, spec: NodeSpec, models: ModelManager, scheduler: Scheduler,
                 metrics: NodeMetrics, version_stats: VersionStatsBook, rng: random.Random,
                 clock: Callable[[], float], prices: Callable[[], CostModel],
                 tasks: Callable[[], set[str]]) -> None:
        self.spec, self.models, self.scheduler = spec, models, scheduler
        self.metrics, self.version_stats = metrics, version_stats
        self._rng, self._clock, self._prices, self._tasks = rng, clock, prices, tasks
        self.slowdown = 1.0  # > 1: an injected fault (spec.fault_injection), see set_faults

    def set_faults(self, slowdown: float) -> None:
        """Fault injection for tests and benchmarks: every local inference takes
        ``slowdown`` times as long (the worker stays busy, like a slow CPU)."""
        if not self.spec.fault_injection:
            raise InvalidRequest(f"fault injection is off on {self.spec.node_id}",
                                 hint="set fault_injection: true in the fleet file (tests only)")
        if not 1.0 <= slowdown <= 1000.0:
            raise InvalidRequest(f"slowdown must be in [1, 1000], got {slowdown}")
        self.slowdown = slowdown
        log.warning("fault injected: local inference %.1fx slower", slowdown)


    def runtime(self, name: str, version: str | None = None) -> ModelRuntime:
        """The active runtime of ``name``, or the one serving ``version`` (active or
        standby); :class:`ModelNotFound` naming what is served otherwise."""
        rt = self.models.runtime(name, version)
        if rt is None:
            raise self._not_served(name, version)
        return rt

    def pick(self, name: str, version: str | None) -> ModelRuntime:
        """The runtime one request runs on: pinned, or the canary for its share."""
        rt = self.models.pick(name, version, self._rng)
        if rt is None:
            raise self._not_served(name, version)
        return rt

    def _not_served(self, name: str, version: str | None) -> ModelNotFound:
        if version is not None and name in self.models.active:
            return ModelNotFound(f"model {name!r} version {version!r} is not served by "
                                 f"{self.spec.node_id}",
                                 hint=f"it serves versions {list(self.models.versions(name))}")
        want = f"{name!r}" + (f" version {version!r}" if version else "")
        return ModelNotFound(f"model {want} is not served by {self.spec.node_id}",
                             hint=f"served: {sorted(self.models.active)}; routed tasks: "
                                  f"{sorted(self._tasks())}")


    def count_exits(self, model: str, out: dict[str, np.ndarray]) -> None:
        """A multi-exit model's answers, by the exit that gave them."""
        for k in out["exit"].tolist() if "exit" in out else ():
            self.metrics.early_exits.labels(self.spec.tier.label, model, str(k)).inc()


    async def run_local(self, placement: Placement, req: Request,
                         inputs: dict[str, np.ndarray], remaining_ms: float) -> StepResult:
        rt = self.pick(placement.model or "", req.version)
        try:
            out, compute_ms = await self.submit(rt, inputs, req.priority,
                                                 self._clock() + remaining_ms / 1000.0,
                                                 optional=req.escalation)
        except Exception as exc:
            # The version's failure -- not a refusal, a deadline or a malformed input.
            if isinstance(exc, RuntimeFailure) or not isinstance(exc, TierlinkError):
                self.version_stats.failed(rt.info.name, rt.info.version)
            raise
        answer = read_answer(rt, out)
        conf = answer.confidence
        label = answer.outputs.get("label")
        self.version_stats.answered(rt.info.name, rt.info.version, compute_ms,
                                    conf.tolist() if conf is not None else (),
                                    label.tolist() if label is not None else (),
                                    LABELS.get())
        # No confidence (a regression without uncertainty, ...): never escalated for it.
        confidence = float(conf.min()) if conf is not None else 1.0
        if conf is not None:
            self.metrics.of(self.metrics.confidence, self.spec.tier.label,
                                           rt.info.name).observe(confidence)
        bill = self._prices().compute_bill(self.spec.tier, compute_ms)
        timings = {"compute_ms": compute_ms}
        if "exit" in out:  # a multi-exit model: which exit answered (the last, for a batch)
            timings["exit"] = float(out["exit"].max())
            self.count_exits(rt.info.name, out)
        outcome = Outcome(self.spec.node_id, self.spec.tier, rt.info.name, (self.spec.node_id,),
                          confidence, bill=bill, timings_ms=timings,
                          model_version=rt.info.version)
        return StepResult(answer.outputs, outcome)

    async def submit(self, rt: ModelRuntime, inputs: dict[str, np.ndarray], priority: Priority,
                      deadline_s: float | None, optional: bool = False
                      ) -> tuple[dict[str, np.ndarray], float]:
        out, ms = await run_model(self.scheduler, rt, inputs, priority, deadline_s,
                                  self.slowdown, self.spec.batching.get(rt.info.name),
                                  optional)
        self.metrics.of(self.metrics.compute, self.spec.tier.label,
                        rt.info.name).observe(ms / 1000)
        return out, ms
