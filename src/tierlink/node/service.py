"""One node's behaviour, independent of HTTP: serve its models, route tasks by policy.

``NodeService`` owns the scheduler (priority queue + admission control), the model runtimes,
the dispatcher with its circuit breakers and link estimators, the cached cluster view and
the metrics. The FastAPI app in ``node/app.py`` only translates HTTP to calls on it.

Two entry points:

* ``infer_model(name, ...)`` — run one of *this node's* model variants (what an OIP client
  such as tritonclient calls); raw outputs, no routing.
* ``infer_task(task, ...)`` — the routed path: build a ``Request``, let the policy plan it,
  let the dispatcher execute the plan across tiers; answers with class probabilities and the
  outcome's routing parameters.

Its own models run through :class:`~tierlink.node.local_models.LocalModels` (the plan's local
step, a model named directly); asynchronous requests through
:class:`~tierlink.node.deferred.AsyncDesk` (answered now, or held for a cheaper price window).

The model versions it serves are a :class:`~tierlink.node.models.ModelManager`'s: each
request for a model runs on its active version, or on its standby (canary) version for the
standby's share of requests, or on exactly the version it is pinned to
(``tierlink.version``). What each version answered is counted per version
(:class:`~tierlink.node.version_stats.VersionStatsBook`) and reported in heartbeats, whose
answers (:meth:`NodeService.apply_answer`) tell the manager which versions to serve.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import (
    ClusterView,
    LanguageModelView,
    LinkView,
    ModelView,
    NodeView,
    Outcome,
    Placement,
    Plan,
    Priority,
    Request,
)
from tierlink.errors import (
    NoFeasiblePlacement,
)
from tierlink.estimate.cost import DAY_S
from tierlink.models.runtime import ModelRuntime, check_task_inputs
from tierlink.node import protocol
from tierlink.node.admission import escalation_queue
from tierlink.node.async_requests import AsyncResults, is_async
from tierlink.node.breaker import BreakerBoard, BreakerSettings, DispatchBreakers
from tierlink.node.deferred import AsyncDesk, DeferredStore
from tierlink.node.device_state import DeviceStateSource
from tierlink.node.dispatcher import Dispatcher, RetryBudget, StepResult, execute_observed
from tierlink.node.exporting import DispatchObserver, NodeExports
from tierlink.node.forwarding import LABELS, Forwarder
from tierlink.node.hard_examples import ExampleSink, uploader_for
from tierlink.node.hedging import Hedger
from tierlink.node.keepwarm import KeepWarm
from tierlink.node.live_routing import NodeRouting
from tierlink.node.local_models import LocalModels
from tierlink.node.mirroring import Mirrors
from tierlink.node.models import ModelManager
from tierlink.node.scheduler import Scheduler, SchedulerConfig
from tierlink.node.spec import NodeSpec
from tierlink.node.splits import SplitPlans, Upstream
from tierlink.node.topology import Topology, rule_of
from tierlink.node.uplink import Uplink
from tierlink.node.version_stats import VersionStatsBook
from tierlink.node.view import ParsedRecords, build_view, check_version_known, heartbeat
from tierlink.policy import Policy
from tierlink.policy.shadow import Decision
from tierlink.routing.deferral import Deferral, deferral
from tierlink.routing.router import Router
from tierlink.telemetry import tracing
from tierlink.telemetry.metrics import NodeMetrics
from tierlink.telemetry.trace_attributes import (
    outcome_attributes,
    plan_attributes,
    route_attributes,
)
from tierlink.transport.client import OipClient

log = logging.getLogger("tierlink.node")





class NodeService:
    """See the module docstring. Create, ``await start()``, serve, ``await stop()``.

    ``runtimes``: the node's models by name. ``models``: the manager of their versions
    (then ``runtimes`` must be its ``active`` dict); by default one that serves
    ``runtimes`` and cannot install (no state directory).
    """

    def __init__(
        self, spec: NodeSpec, runtimes: dict[str, ModelRuntime], *,
        clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
        client: OipClient | None = None,
        records: Callable[[], list[dict[str, Any]]] = list, metrics: NodeMetrics | None = None,
        hard_example_sink: ExampleSink | None = None, models: ModelManager | None = None,
        uplink: Uplink | None = None,
    ) -> None:
        self.spec = spec
        # Store-and-forward toward the parent / control plane (None: no state_dir).
        self.uplink = uplink
        self.models = models if models is not None else ModelManager(runtimes)
        if models is not None and runtimes is not models.active:
            raise ValueError("NodeService: pass models.active as runtimes")
        # The manager's own dict: it swaps a model's runtime in place at each switch.
        self.runtimes = self.models.active
        self.models.on_switch = self._on_switch
        self.version_stats = VersionStatsBook()
        self.routing = spec.routing
        self.metrics = metrics or NodeMetrics(spec.tier.label)
        self.exports = NodeExports(self.metrics, spec.tier.label, self.models)
        self._clock = clock
        self._wall = wall  # the time of day prices are read at (UTC epoch seconds)
        self._rng = random.Random(spec.seed)
        self._records = records  # the registry cache's last view (never raises)
        self._parsed_records = ParsedRecords()  # parsed once per fetched list
        self._client = client or OipClient()
        # The router under the fleet's routing revision, swapped when another arrives.
        self.live = NodeRouting(spec, self._rng, self.metrics)
        self.scheduler = Scheduler(SchedulerConfig(
            workers=spec.workers, max_queue=spec.max_queue, initial_service_ms=self._initial_ms(),
            escalation_queue=escalation_queue(spec.escalation_queue, spec.workers)),
                                   clock=clock, observer=self.metrics)
        # The node's language models as chat placement sees them (set by its chat service).
        self.language_models: Callable[[], tuple[LanguageModelView, ...]] = tuple
        self.local = LocalModels(spec, self.models, self.scheduler, self.metrics,
                                 self.version_stats, self._rng, clock,
                                 lambda: self.routing.cost.at(self.view.day_s), self.tasks)
        for name, rt in runtimes.items():
            self.scheduler.seed_service_ms(name, rt.info.latency_ms)
            self.exports.model_info(name, rt)
        self.topology = Topology(spec.node_id, spec.labels, rule_of(spec), spec.upstreams,
                                 Upstream.maker(spec.node_id, self.routing))
        self._upstreams = self.topology.upstreams  # changed in place as the registry says
        self.breakers = BreakerBoard(
            BreakerSettings(failure_threshold=self.routing.breaker.failure_threshold,
                            cooldown_s=self.routing.breaker.cooldown_s,
                            max_cooldown_s=self.routing.breaker.max_cooldown_s),
            clock=clock, on_transition=self._on_breaker)
        self._inflight = 0
        self.device_state = DeviceStateSource(spec.device_state_file, clock=clock)
        self._ids = random.Random()  # request ids (seeded from the OS: unique across nodes)
        self.hard_examples = uploader_for(spec.hard_examples, spec.node_id, spec.seed,
                                          uplink, hard_example_sink,
                                          self.metrics.count_hard_examples)
        self.split = SplitPlans(spec.node_id, spec.tier, self.runtimes, spec.heads,
                                scheduler=self.scheduler, client=self._client,
                                routing=self.routing, metrics=self.metrics, clock=clock,
                                upstreams=self._upstreams, view=lambda: self.view,
                                refresh_view=self.refresh_view, count_exits=self.local.count_exits,
                                work_dir=Path(spec.state_dir) if spec.state_dir else None)
        self.forward = Forwarder(self._upstreams, self._client, self.routing, clock, self.split,
                                 day_s=lambda: self.view.day_s)
        self.dispatcher = Dispatcher(spec.node_id, spec.tier, self.local.run_local,
                                     self.forward.run_remote,
                                     DispatchBreakers(self.breakers), RetryBudget(self.routing.retry_budget),
                                     DispatchObserver(self.metrics), clock,
                                     margin_ms=self.routing.reserve_ms,
                                     on_hard_example=self._hard_example,
                                     hedger=Hedger(self.routing.hedging))
        self.refresh_view()
        # A share of this node's answers asked again of the most capable model (agreement)
        self.mirrors = Mirrors(self.routing.mirror, spec.node_id, spec.labels.get("site", ""),
                               random.Random(f"{spec.seed}/mirror"), self._mirror_plan,
                               self._run_mirror, self.models.standby_share, self.version_stats, self.metrics)
        # Asynchronous requests: routed now, or held for a cheaper price window.
        self.asynchronous = AsyncDesk(
            AsyncResults(uplink), DeferredStore(Path(spec.state_dir) / "deferred.sqlite"),
            self.infer_task, self._deferral, wall) if uplink is not None and spec.state_dir \
            else None
        self._deferred: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._keepwarm: asyncio.Task[None] | None = None
        self.started_at = time.time()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.scheduler.start()
        self.exports.gauges(self.scheduler, lambda: self._inflight, self.hard_examples)
        self._refresher = asyncio.create_task(self._refresh_loop(), name="view-refresh")
        self.split.start()
        self._keepwarm = (asyncio.create_task(KeepWarm(
            self._client, self._upstreams.values, self._clock).run(), name="keep-warm")
            if self._upstreams or self.topology.rule else None)
        if self.hard_examples is not None:
            self.hard_examples.start()
        if self.uplink is not None:
            self.uplink.start()
        if self.asynchronous is not None:
            self._deferred = asyncio.create_task(self.asynchronous.loop(), name="deferred")

    async def stop(self) -> None:
        await self.mirrors.stop()
        await self.models.stop()
        if self.hard_examples is not None:  # first: its last flush may write to the outbox
            await self.hard_examples.stop()
        if self.uplink is not None:
            await self.uplink.stop()  # undelivered items stay on disk
        await self.split.stop()
        for task in (self._refresher, self._keepwarm, self._deferred):
            if task:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.scheduler.close()
        await self._client.close()
        self.live.close()

    # -- direct model inference (OIP, no routing) ------------------------------------------

    async def infer_model(
        self, name: str, version: str | None, inputs: dict[str, np.ndarray],
        params: dict[str, Any],
    ) -> tuple[dict[str, np.ndarray], str, float]:
        """Run this node's model ``name`` (``version``: pinned); raw outputs, the version
        that ran and its compute ms."""
        # A split's tail runs the active version's segments (see _split_sessions).
        rt = self.local.runtime(name) if protocol.CUT in params \
            else self.local.pick(name, version)
        priority = Priority.parse(params.get(protocol.PRIORITY, "interactive"))
        deadline_ms = params.get(protocol.DEADLINE)
        deadline_s = None if deadline_ms is None else self._clock() + float(deadline_ms) / 1000
        with tracing.span("tierlink.tail" if protocol.CUT in params else "tierlink.model",
                          params.get(protocol.TRACEPARENT),
                          {"tierlink.node": self.spec.node_id, "tierlink.model": name}):
            if protocol.CUT in params:
                out, ms = await self.split.run_tail(name, inputs, params, priority, deadline_s)
            else:
                out, ms = await self.local.submit(rt, inputs, priority, deadline_s)
        self.local.count_exits(name, out)
        return out, rt.info.version, ms

    # -- routed inference -----------------------------------------------------------------

    def tasks(self) -> set[str]:
        local = {rt.info.task for rt in self.runtimes.values()}
        return local | {m.task for n in self.view.nodes.values() for m in n.models}

    def _deferral(self, task: str, inputs: dict[str, np.ndarray], params: dict[str, Any],
                  request_id: str) -> Deferral:
        """When an asynchronous request should run (routing/deferral.py), judged as it
        arrives: refused here, as at once, when it may not be placed."""
        req = self._parse(task, inputs, params, request_id)
        policy, req = self.live.router.arrive(req)
        return deferral(policy, req, self.view, self.routing.cost)

    def _new_id(self) -> str:
        """A request id for a request that brings none: 128 random bits from the node's own
        generator (seeded from the OS once; ``uuid4`` asks the OS on every request)."""
        return f"{self._ids.getrandbits(128):032x}"

    def _parse(self, task: str, inputs: dict[str, np.ndarray], params: dict[str, Any],
               request_id: str) -> Request:
        return protocol.parse_request(task, params, request_id=request_id,
                                      receiver=self.spec.node_id,
                                      input_bytes=sum(a.nbytes for a in inputs.values()),
                                      default_privacy=self.spec.default_privacy,
                                      asynchronous=is_async(params))

    async def infer_task(
        self, task: str, inputs: dict[str, np.ndarray], params: dict[str, Any],
        request_id: str | None,
    ) -> tuple[dict[str, np.ndarray], Outcome, float]:
        """Route one request. Returns outputs, the outcome and this node's time in ms."""
        t0 = self._clock()
        req = self._parse(task, inputs, params, request_id or self._new_id())
        labels = protocol.parse_labels(params, _batch_size(inputs))
        check_task_inputs(self.runtimes.values(), task, inputs)
        check_version_known(self.view, task, req.version)
        self.split.routed(task, t0)  # demand: the split warmer opens cuts of tasks in use
        router = self.live.router  # this request's, to its answer (see node/live_routing.py)
        policy, req = router.arrive(req)
        self._inflight += 1
        token = LABELS.set(labels)
        try:
            traced = tracing.enabled()
            with tracing.span("tierlink.route", params.get(protocol.TRACEPARENT),
                              route_attributes(self.spec.node_id, self.spec.tier, req)
                              if traced else {}) as span:
                result = await self._route(req, router, policy, inputs, t0,
                                           params.get(protocol.SPLIT))
                if span is not None:
                    tracing.set_attributes(span, outcome_attributes(result.outcome))
        finally:
            LABELS.reset(token)
            self._inflight -= 1
        self.mirrors.offer(task, req, inputs, result)
        outcome = replace(result.outcome, routing_revision=router.revision)
        if req.hops == 0:  # the request entered here: its whole bill is counted here, once
            self.metrics.bill(task, outcome, self.spec.node_id, self.spec.labels.get("site", ""))
        return result.outputs, outcome, (self._clock() - t0) * 1000.0

    async def _route(self, req: Request, router: Router, policy: Policy,
                     inputs: dict[str, np.ndarray], t0: float,
                     forced_split: Any = None) -> StepResult:
        view = self.view
        decision = None
        if forced_split:
            plan = router.admit(req, self.split.forced_plan(
                req, str(forced_split), view, router.desk.allow_override))
        else:
            plan, decision = self._plan(router, policy, req, view)
        if plan.empty:
            raise NoFeasiblePlacement(f"{self.spec.node_id}: {plan.reason}",
                                      request_id=req.request_id)
        self.metrics.of(self.metrics.placements, self.spec.tier.label, plan.policy,
                        plan.reason).inc()
        labels = LABELS.get()

        def observe(result: StepResult | None, latency_ms: float) -> None:
            outcome = result.outcome if result is not None else None
            correct = _correctness(result, labels) if result is not None else 0.0
            router.feedback(policy, plan, decision, req, view, outcome, correct, latency_ms)

        result = await execute_observed(self.dispatcher, plan, req, inputs, t0, self._clock,
                                        observe)
        return StepResult(result.outputs, replace(result.outcome, reason=plan.reason))

    def _mirror_plan(self, req: Request, answered: Outcome) -> Plan | None:
        """Where a mirrored request (node/mirroring.py) goes: its plan, admitted by the
        router's privacy check like any other; None when the most capable model it may
        reach is the one that answered (nothing to compare)."""
        router = self.live.router
        plan = router.admit(req, router.desk.most_capable.plan(req, self.view, self._rng))
        if plan.empty:
            raise NoFeasiblePlacement(f"{self.spec.node_id}: {plan.reason}",
                                      request_id=req.request_id)
        first = plan.placements[0]
        return None if first.kind == "local" and first.model == answered.model else plan

    async def _run_mirror(self, plan: Plan, req: Request,
                          inputs: dict[str, np.ndarray]) -> StepResult:
        return await self.dispatcher.execute(plan, req, inputs,
                                             self._clock() + req.deadline_ms / 1000.0)

    @staticmethod
    def _plan(router: Router, policy: Policy, req: Request, view: ClusterView
              ) -> tuple[Plan, Decision | None]:
        """The acting policy's plan; in shadow mode the candidate decides beside it on this
        node's own requests (an application's, not a forwarded one)."""
        with tracing.stage("tierlink.plan") as span:
            plan, decision = router.plan(policy, req, view)
            tracing.set_attributes(span, plan_attributes(plan))
        return plan, decision

    # -- the hard-example loop -------------------------------------------------------------

    def _hard_example(self, placement: Placement, req: Request,
                      inputs: dict[str, np.ndarray], result: StepResult) -> None:
        """The dispatcher's hook: a local answer escalated for low confidence."""
        self.version_stats.escalated(result.outcome.model, result.outcome.model_version)
        if self.hard_examples is not None:
            self.hard_examples.offer(placement, req, inputs, result.outputs.get("probabilities"),
                                     LABELS.get())

    # -- view, heartbeat, metrics ----------------------------------------------------------

    def me(self) -> NodeView:
        stats = self.scheduler.snapshot()
        models = tuple(self._view_of(name, rt, stats.service_ms_by_key)
                       for name, rt in self.runtimes.items())
        return NodeView(self.spec.node_id, self.spec.tier, models, queue_depth=stats.queue_depth,
                        inflight=stats.inflight, workers=stats.workers,
                        heads=self.split.view_heads(stats.service_ms_by_key),
                        language_models=self.language_models(),
                        state=self.device_state.read())

    def link_views(self) -> list[LinkView]:
        """This node's estimates of its links to its upstreams."""
        return [u.estimator.view() for u in self._upstreams.values()]

    def _view_of(self, name: str, rt: ModelRuntime,
                 service_ms: Mapping[str, float]) -> ModelView:
        """The active version's figures; ``versions``: every version served (a canary)."""
        view = rt.info.view(service_ms.get(name, rt.info.latency_ms))
        versions = self.models.versions(name)
        return view if versions == (view.version,) else replace(view, versions=versions)

    def refresh_view(self) -> None:
        """Rebuild the snapshot the policy decides over (timer, breaker change, heartbeat);
        the upstreams follow the registry first (node/topology.py)."""
        records = self._records()
        self.topology.sync(records)
        self.view = build_view(self.me(), records,
                          [u.estimator.view() for u in self._upstreams.values()],
                          self.breakers.healthy, self.forward.outstanding, self._parsed_records,
                          self._wall() % DAY_S)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.spec.view_refresh_s)
            try:
                self.refresh_view()
            except Exception:  # never let the refresher die; the old view stays
                log.exception("view refresh failed; keeping the previous view")

    def heartbeat_body(self, address: str) -> dict[str, Any]:
        """The node's state for the control plane (``node/view.heartbeat``)."""
        return {**heartbeat(self.me(), address, self.models, self.version_stats,
                            [u.estimator.view() for u in self._upstreams.values()],
                            self.started_at, self.spec.labels),
                "traffic": self.exports.traffic.to_dict(), "breakers_open": sorted(
                    n for n, state in self.breakers.states().items() if state == "open"),
                "outbox_pending": 0 if self.uplink is None else self.uplink.outbox.pending(),
                "routing_revision": self.live.revision,
                "process": self.metrics.process.snapshot() if self.metrics.process else None}

    async def apply_answer(self, answer: Mapping[str, Any]) -> None:
        """A heartbeat answer: place requests under the routing revision it hands out (when
        another), serve the model versions its ``desired`` asks for (the heartbeat loop's
        ``on_answer``; returns at once, installs run in the background)."""
        self.topology.draining = bool(answer.get("draining"))
        self.live.apply(answer.get("routing"))
        await self.models.apply_desired(answer.get("desired"))

    def _on_switch(self, name: str, rt: ModelRuntime) -> None:
        """A new active version: split tails are cut from its graph from now on."""
        self.split.switched(name, rt)
        self.exports.model_info(name, rt)
        self.refresh_view()

    def status(self) -> dict[str, Any]:
        stats = self.scheduler.snapshot()
        return {"node_id": self.spec.node_id, "tier": self.spec.tier.label,
                "models": sorted(self.runtimes), "tasks": sorted(self.tasks()),
                "providers": {name: getattr(rt, "provider", rt.platform)
                              for name, rt in sorted(self.runtimes.items())},
                "queue_depth": stats.queue_depth, "inflight": stats.inflight + self._inflight,
                "breakers": self.breakers.states(), "outstanding": dict(self.forward.outstanding),
                "view_nodes": sorted(self.view.nodes), "draining": self.topology.draining,
                "routing_revision": self.live.revision, "policy": self.live.config.policy,
                "split_open": self.split.open_cuts(),
                "links": {k: {"rtt_ms": round(u.estimator.view().rtt_ms, 3),
                              "bandwidth_mbit": round(u.estimator.view().bandwidth_mbit, 3),
                              "request_ms": round(u.estimator.request_ms, 3),
                              "samples": u.estimator.samples}
                          for k, u in self._upstreams.items()},
                "uplink": self.uplink.status() if self.uplink is not None else None}

    def _on_breaker(self, node_id: str, old: str, new: str) -> None:
        self.exports.breaker(node_id, new)
        log.warning("breaker to %s: %s -> %s", node_id, old, new)
        self.refresh_view()

    def _initial_ms(self) -> float:
        return max((rt.info.latency_ms for rt in self.runtimes.values()), default=5.0)


def _batch_size(inputs: dict[str, np.ndarray]) -> int:
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


__all__ = ["NodeService"]


def _correctness(result: StepResult, labels: tuple[int, ...] | None) -> float:
    """How right an answer is, for a learning policy: the share of labels its top-1 meets
    when the request carried them, else its calibrated confidence (expected correctness)."""
    pred = result.outputs.get("label")
    if labels and pred is not None and np.asarray(pred).size == len(labels):
        return float(np.mean(np.asarray(pred).reshape(-1) == np.asarray(labels)))
    return result.outcome.confidence
