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

The model versions it serves are a :class:`~tierlink.node.models.ModelManager`'s: each
request for a model runs on its active version, or on its standby (canary) version for the
standby's share of requests, or on exactly the version it is pinned to
(``tierlink.version``). What each version answered is counted per version
(:class:`~tierlink.node.version_stats.VersionStatsBook`) and reported in heartbeats, whose
answers (:meth:`NodeService.apply_answer`) tell the manager which versions to serve.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from tierlink import __version__
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
    ConfigError,
    DeadlineExceeded,
    InvalidRequest,
    ModelNotFound,
    NoFeasiblePlacement,
    PrivacyViolation,
    RuntimeFailure,
    TensorError,
    TierlinkError,
)
from tierlink.estimate.latency import LinkEstimator
from tierlink.node import protocol
from tierlink.node.async_requests import AsyncResults
from tierlink.node.breaker import BreakerBoard, BreakerSettings, DispatchBreakers
from tierlink.node.dispatcher import Dispatcher, RetryBudget, StepResult, execute_observed
from tierlink.node.hard_examples import ExampleSink, HardExampleUploader, OutboxSink
from tierlink.node.heads import check_features_may_leave
from tierlink.node.hedging import Hedger
from tierlink.node.keepwarm import KeepWarm
from tierlink.node.models import ModelManager
from tierlink.node.runtime import (
    ModelRuntime,
    read_answer,
    validate_inputs,
)
from tierlink.node.scheduler import Scheduler, SchedulerConfig
from tierlink.node.spec import NodeSpec
from tierlink.node.splits import SplitPlans, Upstream
from tierlink.node.uplink import CONTROL, Uplink
from tierlink.node.version_stats import VersionStatsBook
from tierlink.node.view import ParsedRecords, build_view, model_view_to_dict
from tierlink.policy import REGISTRY, Policy
from tierlink.policy.bandit import reward_of, teach
from tierlink.policy.ope import Logged, log_line
from tierlink.policy.placement import TierlinkPolicy, split_plans
from tierlink.policy.shadow import Decision, Shadow
from tierlink.telemetry import tracing
from tierlink.telemetry.metrics import NodeMetrics
from tierlink.transport.client import OipClient

log = logging.getLogger("tierlink.node")

# The client's labels (``tierlink.label``) of the request being routed. They are not part of
# the core ``Request`` (nothing in routing reads them); like the trace context, they ride the
# request's async context from ``infer_task`` to the hop that forwards them and to the
# hard-example hook, both called from within that same task.
_LABELS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "tierlink_labels", default=None)


PROBE_SMALL, PROBE_LARGE = 64, 64 * 1024  # bytes: two sizes give RTT and bandwidth


class NodeService:
    """See the module docstring. Create, ``await start()``, serve, ``await stop()``.

    ``runtimes``: the node's models by name. ``models``: the manager of their versions
    (then ``runtimes`` must be its ``active`` dict); by default one that serves
    ``runtimes`` and cannot install (no state directory).
    """

    def __init__(
        self, spec: NodeSpec, runtimes: dict[str, ModelRuntime], *,
        clock: Callable[[], float] = time.monotonic, client: OipClient | None = None,
        records: Callable[[], list[dict[str, Any]]] = list, metrics: NodeMetrics | None = None,
        hard_example_sink: ExampleSink | None = None, models: ModelManager | None = None,
        uplink: Uplink | None = None,
    ) -> None:
        self.spec = spec
        # Store-and-forward toward the parent / control plane (None: no state_dir).
        self.uplink = uplink
        self.async_results = AsyncResults(uplink) if uplink is not None else None
        self.models = models if models is not None else ModelManager(runtimes)
        if models is not None and runtimes is not models.active:
            raise ValueError("NodeService: pass models.active as runtimes")
        # The manager's own dict: it swaps a model's runtime in place at each switch.
        self.runtimes = self.models.active
        self.models.on_switch = self._on_switch
        self.version_stats = VersionStatsBook()
        self.routing = spec.routing()
        self.metrics = metrics or NodeMetrics(spec.tier.label)
        self.metrics.registry.register(_InstallsCollector(self.models, spec.tier.label))
        self._clock = clock
        self._rng = random.Random(spec.seed)
        self._records = records  # the registry cache's last view (never raises)
        self._parsed_records = ParsedRecords()  # parsed once per fetched list
        self._client = client or OipClient()
        self._policies = {name: REGISTRY.create(name, self.routing.policy_config())
                          for name in REGISTRY.names()}
        self._default_policy = self._policy_named(self.routing.policy)
        self.scheduler = Scheduler(SchedulerConfig(workers=spec.workers, max_queue=spec.max_queue,
                                                   initial_service_ms=self._initial_ms()),
                                   clock=clock, observer=self.metrics)
        self._model_info: dict[str, tuple[str, ...]] = {}  # model -> its info labels
        # The node's language models as chat placement sees them (set by its chat service).
        self.language_models: Callable[[], tuple[LanguageModelView, ...]] = tuple
        for name, rt in runtimes.items():
            self.scheduler.seed_service_ms(name, rt.info.latency_ms)
            self._export_model_info(name, rt)
        self._upstreams = {u.node_id: Upstream(u, LinkEstimator(
            LinkView(spec.node_id, u.node_id, u.rtt_ms, u.bandwidth_mbit, u.loss),
            hop_overhead_ms=self.routing.policy_config().estimates.hop_overhead_ms))
            for u in spec.upstreams}
        self.breakers = BreakerBoard(
            BreakerSettings(failure_threshold=self.routing.breaker.failure_threshold,
                            cooldown_s=self.routing.breaker.cooldown_s,
                            max_cooldown_s=self.routing.breaker.max_cooldown_s),
            clock=clock, on_transition=self._on_breaker)
        self._outstanding: dict[str, int] = {}
        self._inflight = 0
        self.hard_examples = self._uploader(hard_example_sink)
        self.split = SplitPlans(spec.node_id, spec.tier, self.runtimes, spec.heads,
                                scheduler=self.scheduler, client=self._client,
                                routing=self.routing, metrics=self.metrics, clock=clock,
                                upstreams=self._upstreams, view=lambda: self.view,
                                refresh_view=self.refresh_view, count_exits=self._count_exits)
        self.dispatcher = Dispatcher(spec.node_id, spec.tier, self._run_local, self._run_remote,
                                     DispatchBreakers(self.breakers), RetryBudget(self.routing.retry_budget),
                                     _Observer(self.metrics), clock,
                                     margin_ms=self.routing.reserve_ms,
                                     on_hard_example=self._hard_example,
                                     hedger=Hedger(self.routing.hedging))
        self.shadow, self._shadow_file, self._shadow_candidate = self._shadow_mode()
        self.refresh_view()
        self._refresher: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None
        self._keepwarm: asyncio.Task[None] | None = None
        self.started_at = time.time()
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

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.scheduler.start()
        self._register_gauges()
        self._refresher = asyncio.create_task(self._refresh_loop(), name="view-refresh")
        self._prober = (asyncio.create_task(self._probe_loop(), name="link-probe")
                        if self.routing.probe_idle_s > 0 and self.spec.heads and self._upstreams
                        else None)
        self.split.start()
        self._keepwarm = (asyncio.create_task(KeepWarm(
            self._client, self._upstreams.values, self._clock).run(), name="keep-warm")
            if self._upstreams else None)
        if self.hard_examples is not None:
            self.hard_examples.start()
        if self.uplink is not None:
            self.uplink.start()

    async def stop(self) -> None:
        await self.models.stop()
        if self.hard_examples is not None:  # first: its last flush may write to the outbox
            await self.hard_examples.stop()
        if self.uplink is not None:
            await self.uplink.stop()  # undelivered items stay on disk
        await self.split.stop()
        for task in (self._refresher, self._prober, self._keepwarm):
            if task:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.scheduler.close()
        await self._client.close()
        if self._shadow_file is not None:
            self._shadow_file.close()

    # -- direct model inference (OIP, no routing) ------------------------------------------

    def runtime(self, name: str, version: str | None = None) -> ModelRuntime:
        """The active runtime of ``name``, or the one serving ``version`` (active or
        standby); :class:`ModelNotFound` naming what is served otherwise."""
        rt = self.models.runtime(name, version)
        if rt is None:
            raise self._not_served(name, version)
        return rt

    def _pick(self, name: str, version: str | None) -> ModelRuntime:
        """The runtime one request runs on: pinned, or the canary for its share."""
        rt = self.models.pick(name, version, self._rng)
        if rt is None:
            raise self._not_served(name, version)
        return rt

    def _not_served(self, name: str, version: str | None) -> ModelNotFound:
        if version is not None and name in self.runtimes:
            return ModelNotFound(f"model {name!r} version {version!r} is not served by "
                                 f"{self.spec.node_id}",
                                 hint=f"it serves versions {list(self.models.versions(name))}")
        want = f"{name!r}" + (f" version {version!r}" if version else "")
        return ModelNotFound(f"model {want} is not served by {self.spec.node_id}",
                             hint=f"served: {sorted(self.runtimes)}; routed tasks: "
                                  f"{sorted(self.tasks())}")

    async def infer_model(
        self, name: str, version: str | None, inputs: dict[str, np.ndarray],
        params: dict[str, Any],
    ) -> tuple[dict[str, np.ndarray], str]:
        """Run this node's model ``name`` (``version``: pinned); raw outputs and the
        version that ran."""
        # A split's tail runs the active version's segments (see _split_sessions).
        rt = self.runtime(name) if protocol.CUT in params else self._pick(name, version)
        priority = Priority.parse(params.get(protocol.PRIORITY, "interactive"))
        deadline_ms = params.get(protocol.DEADLINE)
        deadline_s = None if deadline_ms is None else self._clock() + float(deadline_ms) / 1000
        if protocol.CUT in params:
            out = await self.split.run_tail(name, inputs, params, priority, deadline_s)
        else:
            out, _ = await self._submit(rt, inputs, priority, deadline_s)
        self._count_exits(name, out)
        return out, rt.info.version

    def _count_exits(self, model: str, out: dict[str, np.ndarray]) -> None:
        """A multi-exit model's answers, by the exit that gave them."""
        for k in out["exit"].tolist() if "exit" in out else ():
            self.metrics.early_exits.labels(self.spec.tier.label, model, str(k)).inc()

    # -- split plans: tails served here, heads run here ------------------------------------

    # -- routed inference -----------------------------------------------------------------

    def tasks(self) -> set[str]:
        local = {rt.info.task for rt in self.runtimes.values()}
        return local | {m.task for n in self.view.nodes.values() for m in n.models}

    async def infer_async(self, task: str, inputs: dict[str, np.ndarray],
                          params: dict[str, Any], request_id: str | None) -> dict[str, Any]:
        """Route a ``tierlink.async`` request like any other, then queue its result durably
        toward the control plane; ``{"request_id", "status": "accepted", "uplink",
        "result_key"}``. While the uplink is down the result waits on this node's disk."""
        if self.async_results is None:
            raise InvalidRequest(f"{self.spec.node_id} keeps no state_dir: it cannot answer "
                                 "asynchronously", hint="send the request without tierlink.async")
        request_id = request_id or uuid.uuid4().hex
        outputs, outcome, server_ms = await self.infer_task(task, inputs, params, request_id)
        return await self.async_results.accept(request_id, task, outputs, outcome, server_ms)

    async def infer_task(
        self, task: str, inputs: dict[str, np.ndarray], params: dict[str, Any],
        request_id: str | None,
    ) -> tuple[dict[str, np.ndarray], Outcome, float]:
        """Route one request. Returns outputs, the outcome and this node's time in ms."""
        t0 = self._clock()
        req = protocol.parse_request(task, params, request_id=request_id or uuid.uuid4().hex,
                                     receiver=self.spec.node_id,
                                     input_bytes=sum(a.nbytes for a in inputs.values()))
        labels = protocol.parse_labels(params, _batch_size(inputs))
        self._check_task_inputs(task, inputs)
        self.split.routed(task, t0)  # demand: the split warmer opens cuts of tasks in use
        policy = self._policy_for(req)
        req = self._check_receipt(req, policy)
        self._inflight += 1
        token = _LABELS.set(labels)
        try:
            with tracing.span("tierlink.route", params.get(protocol.TRACEPARENT),
                              {"tierlink.node": self.spec.node_id, "tierlink.task": task}):
                result = await self._route(req, policy, inputs, t0,
                                           params.get(protocol.SPLIT))
        finally:
            _LABELS.reset(token)
            self._inflight -= 1
        return result.outputs, result.outcome, (self._clock() - t0) * 1000.0

    def _check_task_inputs(self, task: str, inputs: dict[str, np.ndarray]) -> None:
        """A malformed input is refused here, where it arrives, never sent up the fleet:
        checked against the signature of this node's model of the task (every model of a
        task takes the same inputs), when it has one."""
        rt = next((rt for rt in self.runtimes.values() if rt.info.task == task), None)
        if rt is not None:
            try:
                validate_inputs(rt.info.name, rt.inputs, inputs)
            except TensorError as exc:
                raise TensorError(f"task {task!r}: {exc.message}", hint=exc.hint) from None

    async def _route(self, req: Request, policy: Policy, inputs: dict[str, np.ndarray],
                     t0: float, forced_split: Any = None) -> StepResult:
        view = self.view
        decision = None
        if forced_split:
            plan = self._forced_split(req, str(forced_split))
        else:
            plan, decision = self._plan(policy, req, view)
        if plan.empty:
            raise NoFeasiblePlacement(f"{self.spec.node_id}: {plan.reason}",
                                      request_id=req.request_id)
        self.metrics.placements.labels(self.spec.tier.label, plan.policy, plan.reason).inc()
        labels = _LABELS.get()

        def observe(result: StepResult | None, latency_ms: float) -> None:
            outcome = result.outcome if result is not None else None
            correct = _correctness(result, labels) if result is not None else 0.0
            teach(policy, plan, req, view, outcome, correct, latency_ms)
            self._shadow_log(decision, policy, req, view, outcome, correct, latency_ms)

        return await execute_observed(self.dispatcher, plan, req, inputs, t0, self._clock,
                                      observe)

    def _plan(self, policy: Policy, req: Request, view: ClusterView
              ) -> tuple[Plan, Decision | None]:
        """The acting policy's plan; in shadow mode the candidate decides beside it on this
        node's own requests (an application's, not a forwarded one)."""
        if self.shadow is None or req.hops > 0 or not isinstance(policy, TierlinkPolicy):
            return policy.plan(req, view, self._rng), None
        return self.shadow.plan(req, view, self._rng)

    def _shadow_log(self, decision: Decision | None, policy: Policy, req: Request,
                    view: ClusterView, outcome: Outcome | None, correct: float,
                    latency_ms: float) -> None:
        if decision is None or self._shadow_file is None or \
                not isinstance(policy, TierlinkPolicy):
            return
        reward = reward_of(self.routing.reward, req, policy.reference_cost(req, view),
                           outcome, correct, latency_ms)
        line = log_line(Logged(decision.acting, decision.candidate, decision.propensity,
                               reward, decision.acting_features, decision.candidate_features),
                        self._shadow_candidate)
        try:
            self._shadow_file.write(line + "\n")
        except OSError as exc:  # a full disk costs the log a line, never the answer
            self.metrics.shadow_dropped.labels(self.spec.tier.label).inc()
            log.warning("shadow log: a decision was not written: %s", exc)

    def _forced_split(self, req: Request, text: str) -> Plan:
        """The one-placement plan a request asked for with ``tierlink.split=NODE/CUT/CODEC``
        (benchmarks measure every cut this way); allowed where policy overrides are."""
        if not self.routing.allow_policy_override:
            raise InvalidRequest(f"this fleet does not allow choosing a split per request "
                                 f"({protocol.SPLIT})",
                                 hint="set routing.allow_policy_override in the fleet file")
        node, _, rest = text.partition("/")
        cut, _, codec = rest.rpartition("/")
        up = self._upstreams.get(node)
        target = self.view.nodes.get(node)
        if up is None or target is None or not cut or not codec:
            raise InvalidRequest(f"{protocol.SPLIT}={text!r}: expected NODE/CUT/CODEC with "
                                 f"NODE one of this node's upstreams {sorted(self._upstreams)}")
        models = [m for m in target.models if m.task == req.task and m.name in self.split.sessions]
        if not models:
            raise InvalidRequest(f"{node} serves no model of {req.task!r} whose head "
                                 f"{self.spec.node_id} holds")
        check_features_may_leave(req, target.tier, self.spec.node_id,  # 403 now, not later
                                 self.routing.local_features_may_leave)
        # What the policy expects of this plan (0 when it would not consider it), so a
        # benchmark can compare every plan's estimate with what it really took.
        plans = split_plans(self.view.nodes[self.spec.node_id], target, models[0], self.view,
                            self.routing.policy_config())
        est = next((p.total_ms - p.head_ms for p in plans if p.cut == cut and p.codec == codec),
                   0.0)  # like a policy's split placement: the part after the head
        return Plan((Placement("remote", node, target.tier, models[0].name, est_ms=est,
                               cut=cut, codec=codec),), "forced_split", "forced by the request")

    def _policy_for(self, req: Request) -> Policy:
        if req.policy is None or req.policy == self._default_policy.name:
            return self._default_policy
        if not self.routing.allow_policy_override:
            raise InvalidRequest(f"this fleet does not allow choosing the policy per request "
                                 f"({protocol.POLICY}={req.policy!r})",
                                 hint="set routing.allow_policy_override in the fleet file")
        return self._policy_named(req.policy)

    def _policy_named(self, name: str) -> Policy:
        if name not in self._policies:
            raise InvalidRequest(f"unknown policy {name!r}", hint=f"one of {sorted(self._policies)}")
        return self._policies[name]

    def _check_receipt(self, req: Request, policy: Policy) -> Request:
        """Count what this node actually received; refuse what it may not hold.

        Verdicts: ``allowed``; ``violation`` — this node is the first to hold the input
        against its privacy level (so summing violations counts *requests*); ``beyond`` —
        an earlier hop already had, and said so in the request."""
        allowed = req.privacy.allows(self.spec.tier, at_origin=req.origin == self.spec.node_id)
        verdict = "allowed" if allowed else ("beyond" if req.privacy_breached else "violation")
        self.metrics.inputs_received.labels(self.spec.tier.label, req.privacy.value, verdict).inc()
        if not allowed and policy.respects_privacy:
            raise PrivacyViolation(f"{self.spec.node_id} ({self.spec.tier.label}) may not hold "
                                   f"a {req.privacy.value!r} input from {req.origin}")
        if req.deadline_ms <= 0 and policy.respects_deadline:
            raise DeadlineExceeded(f"request {req.request_id} arrived with its deadline spent "
                                   f"({req.deadline_ms:.1f} ms left)")
        return req if allowed else replace(req, privacy_breached=True)

    # -- the dispatcher's steps ------------------------------------------------------------

    async def _run_local(self, placement: Placement, req: Request,
                         inputs: dict[str, np.ndarray], remaining_ms: float) -> StepResult:
        rt = self._pick(placement.model or "", req.version)
        try:
            out, compute_ms = await self._submit(rt, inputs, req.priority,
                                                 self._clock() + remaining_ms / 1000.0)
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
                                    _LABELS.get())
        # No confidence (a regression without uncertainty, ...): never escalated for it.
        confidence = float(conf.min()) if conf is not None else 1.0
        if conf is not None:
            self.metrics.confidence.labels(self.spec.tier.label,
                                           rt.info.name).observe(confidence)
        cost = self.routing.cost.compute(self.spec.tier, compute_ms)
        self.metrics.cost.labels(self.spec.tier.label).inc(cost)
        timings = {"compute_ms": compute_ms}
        if "exit" in out:  # a multi-exit model: which exit answered (the last, for a batch)
            timings["exit"] = float(out["exit"].max())
            self._count_exits(rt.info.name, out)
        outcome = Outcome(self.spec.node_id, self.spec.tier, rt.info.name, (self.spec.node_id,),
                          confidence, cost=cost, timings_ms=timings,
                          model_version=rt.info.version)
        return StepResult(answer.outputs, outcome)

    async def _submit(self, rt: ModelRuntime, inputs: dict[str, np.ndarray], priority: Priority,
                      deadline_s: float | None) -> tuple[dict[str, np.ndarray], float]:
        timing: list[float] = []

        slowdown = self.slowdown

        def call() -> dict[str, np.ndarray]:
            start = time.perf_counter()
            try:
                out = rt.infer(inputs)
                if slowdown > 1.0:  # injected fault: this node computes N times slower
                    time.sleep((slowdown - 1.0) * (time.perf_counter() - start))
                return out
            finally:
                timing.append((time.perf_counter() - start) * 1000.0)

        # A slowed node (injected fault) sleeps in ``call``: never on the event loop.
        out = await self.scheduler.submit(call, priority=priority, deadline_s=deadline_s,
                                          key=rt.info.name, inline=slowdown <= 1.0)
        self.metrics.compute.labels(self.spec.tier.label, rt.info.name).observe(timing[0] / 1000)
        return out, timing[0]

    async def _run_remote(self, placement: Placement, req: Request,
                          inputs: dict[str, np.ndarray], remaining_ms: float,
                          budget_ms: float) -> StepResult:
        if placement.cut:
            return await self.split.run_split(placement, req, inputs, budget_ms)
        up = self._upstreams[placement.node_id]
        link = up.estimator.view()
        send_ms = budget_ms - link.rtt_ms - self.routing.reserve_ms
        if send_ms <= 0:
            raise DeadlineExceeded(f"no time left for the hop to {placement.node_id} "
                                   f"({budget_ms:.1f} ms left, link RTT {link.rtt_ms:.1f} ms)")
        params = protocol.forward_params(req, send_ms, tracing.current_traceparent(),
                                         _LABELS.get())
        node = placement.node_id
        self._outstanding[node] = self._outstanding.get(node, 0) + 1
        start = self._clock()
        try:
            resp = await self._client.infer(up.spec.url, req.task, inputs, params,
                                            timeout_s=budget_ms / 1000.0)
        finally:
            self._outstanding[node] -= 1
        total_ms = (self._clock() - start) * 1000.0
        outcome = protocol.parse_outcome(resp.parameters)
        up.estimator.observe(total_ms, outcome.timings_ms.get("server_ms", 0.0), req.input_bytes)
        up.last_seen = up.last_used = self._clock()
        transfer = self.routing.cost.transfer(placement.tier, req.input_bytes)
        return StepResult(resp.outputs, replace(outcome, cost=outcome.cost + transfer))

    # -- the hard-example loop -------------------------------------------------------------

    def _shadow_mode(self) -> tuple[Shadow | None, TextIO | None, dict[str, Any]]:
        """``routing.shadow``: the candidate beside the acting policy, its decisions appended
        to ``state_dir/shadow.jsonl`` (line-buffered: a crash loses at most a line)."""
        cfg = self.routing.shadow
        acting = self._default_policy
        if cfg is None or not isinstance(acting, TierlinkPolicy):
            return None, None, {}
        if not self.spec.state_dir:
            raise ConfigError("routing.shadow needs the node's state_dir for its log")
        policy_cfg = self.routing.policy_config()
        if cfg.weights is not None:
            policy_cfg = replace(policy_cfg, weights=cfg.weights)
        candidate = REGISTRY.create(cfg.policy, policy_cfg)
        if not isinstance(candidate, TierlinkPolicy):
            raise ConfigError(f"routing.shadow.policy {cfg.policy!r} cannot run in shadow "
                              "mode: it does not order the tierlink policy's options")
        path = Path(self.spec.state_dir) / "shadow.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        shadow = Shadow(acting, candidate, cfg.explore,
                        random.Random(f"shadow:{self.spec.node_id}"))
        try:
            return shadow, path.open("a", buffering=1), cfg.to_dict()
        except OSError as exc:
            raise ConfigError(f"routing.shadow: cannot open the shadow log {path}: {exc}",
                              hint="give the node a writable state_dir") from None

    def _uploader(self, sink: ExampleSink | None) -> HardExampleUploader | None:
        """Hard examples go through the durable outbox when the node's uplink reaches the
        control plane (``sink`` is then unused), else straight to ``sink``; None: nowhere."""
        config = self.spec.hard_examples()
        if self.uplink is not None and CONTROL in self.uplink.destinations:
            sink = OutboxSink(self.uplink)
        if sink is None or not config.enabled:
            return None
        return HardExampleUploader(sink, config, self.spec.node_id,
                                   count=self.metrics.count_hard_examples,
                                   rng=random.Random(self.spec.seed + 1),
                                   eager=isinstance(sink, OutboxSink))

    def _hard_example(self, placement: Placement, req: Request,
                      inputs: dict[str, np.ndarray], result: StepResult) -> None:
        """The dispatcher's hook: a local answer escalated for low confidence."""
        self.version_stats.escalated(result.outcome.model, result.outcome.model_version)
        if self.hard_examples is not None:
            self.hard_examples.offer(placement, req, inputs, result.outputs.get("probabilities"),
                                     _LABELS.get())

    # -- link probes -----------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        """Keep idle links measured: a link that carried no traffic for ``probe_idle_s``
        gets a small and a large probe, so its bandwidth estimate (what split plans are
        priced with) follows the link even while no request uses it."""
        idle = self.routing.probe_idle_s
        while True:
            await asyncio.sleep(idle / 2)
            for up in list(self._upstreams.values()):
                if self._clock() - up.last_seen >= idle:
                    await self._probe(up)

    async def _probe(self, up: Upstream) -> None:
        for nbytes in (PROBE_SMALL, PROBE_LARGE):
            start = self._clock()
            try:
                await self._client.probe(up.spec.url, nbytes, timeout_s=5.0)
            except TierlinkError:
                return  # an unreachable upstream is the breakers' business, not the probe's
            up.estimator.observe((self._clock() - start) * 1000.0, 0.0, nbytes, probe=True)
        up.last_seen = up.last_used = self._clock()

    # -- view, heartbeat, metrics ----------------------------------------------------------

    def me(self) -> NodeView:
        stats = self.scheduler.snapshot()
        models = tuple(self._view_of(name, rt, stats.service_ms_by_key)
                       for name, rt in self.runtimes.items())
        return NodeView(self.spec.node_id, self.spec.tier, models, queue_depth=stats.queue_depth,
                        inflight=stats.inflight, workers=stats.workers,
                        heads=self.split.view_heads(stats.service_ms_by_key),
                        language_models=self.language_models())

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
        """Rebuild the snapshot the policy decides over (timer, breaker change, heartbeat)."""
        self.view = build_view(self.me(), self._records(),
                          [u.estimator.view() for u in self._upstreams.values()],
                          self.breakers.healthy, self._outstanding, self._parsed_records)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.spec.view_refresh_s)
            try:
                self.refresh_view()
            except Exception:  # never let the refresher die; the old view stays
                log.exception("view refresh failed; keeping the previous view")

    def heartbeat_body(self, address: str) -> dict[str, Any]:
        """The node's state for the control plane: one ``models`` entry per version
        served (``role`` active / standby, its ``weight``, its ``stats``), and the
        versions it could not install (``install_failures``)."""
        me = self.me()
        return {
            "node_id": me.node_id, "tier": me.tier.label, "address": address,
            "models": self._model_entries(me),
            "language_models": [lm.to_dict() for lm in me.language_models],
            "install_failures": self.models.failures(),
            "queue_depth": me.queue_depth, "inflight": me.inflight,  # compute, not routing
            "workers": me.workers, "upstream": sorted(self._upstreams),
            "links": [{"dst": l.dst, "rtt_ms": round(l.rtt_ms, 3),
                       "bandwidth_mbit": l.bandwidth_mbit, "loss": l.loss}
                      for l in (u.estimator.view() for u in self._upstreams.values())],
            "started_at": self.started_at, "software": __version__,
        }

    def _model_entries(self, me: NodeView) -> list[dict[str, Any]]:
        views = {m.name: m for m in me.models}
        entries = []
        for served in self.models.served():
            info = served.runtime.info  # views and stats go by the card's name
            view = views.get(info.name) if served.role == "active" else None
            entry = model_view_to_dict(view or info.view())
            entry.update(role=served.role, weight=round(served.weight, 6),
                         stats=self.version_stats.get(info.name, info.version))
            entries.append(entry)
        return entries

    async def apply_answer(self, answer: Mapping[str, Any]) -> None:
        """A heartbeat answer: serve the model versions its ``desired`` asks for (the
        heartbeat loop's ``on_answer``; returns at once, installs run in the background)."""
        await self.models.apply_desired(answer.get("desired"))

    def _on_switch(self, name: str, rt: ModelRuntime) -> None:
        """A new active version: split tails are cut from its graph from now on."""
        self.split.switched(name, rt)
        self._export_model_info(name, rt)
        self.refresh_view()

    def _export_model_info(self, name: str, rt: ModelRuntime) -> None:
        """``tierlink_model_info`` = 1 for the version served now (its kind and provider)."""
        labels = (self.spec.tier.label, name, rt.info.version,
                  rt.info.spec_for(rt.outputs).kind, getattr(rt, "provider", rt.platform))
        previous = self._model_info.get(name)
        if previous is not None and previous != labels:  # the version it replaces
            self.metrics.model_info.remove(*previous)
        self._model_info[name] = labels
        self.metrics.model_info.labels(*labels).set(1)

    def record_request(self, kind: str, name: str, outcome: str, seconds: float) -> None:
        tier = self.spec.tier.label
        self.metrics.requests.labels(tier, kind, name, outcome).inc()
        self.metrics.latency.labels(tier, kind, name, outcome).observe(seconds)

    def status(self) -> dict[str, Any]:
        stats = self.scheduler.snapshot()
        return {"node_id": self.spec.node_id, "tier": self.spec.tier.label,
                "models": sorted(self.runtimes), "tasks": sorted(self.tasks()),
                "providers": {name: getattr(rt, "provider", rt.platform)
                              for name, rt in sorted(self.runtimes.items())},
                "queue_depth": stats.queue_depth, "inflight": stats.inflight + self._inflight,
                "breakers": self.breakers.states(), "outstanding": dict(self._outstanding),
                "view_nodes": sorted(self.view.nodes),
                "split_open": self.split.open_cuts(),
                "links": {k: {"rtt_ms": round(u.estimator.view().rtt_ms, 3),
                              "bandwidth_mbit": round(u.estimator.view().bandwidth_mbit, 3),
                              "request_ms": round(u.estimator.request_ms, 3),
                              "samples": u.estimator.samples}
                          for k, u in self._upstreams.items()},
                "uplink": self.uplink.status() if self.uplink is not None else None}

    def uplink_state(self) -> str | None:
        """``"up"`` / ``"down"`` toward this node's upstream (store-and-forward); None when
        the node keeps no outbox. Every routed answer says it (``tierlink.uplink``)."""
        if self.uplink is None:
            return None
        return "down" if self.uplink.is_down() else "up"

    def _register_gauges(self) -> None:
        tier = self.spec.tier.label
        for p in Priority:
            self.metrics.queue_depth.labels(tier, p.label).set_function(self._depth_of(p))
        self.metrics.inflight.labels(tier).set_function(lambda: self._inflight)
        if self.hard_examples is not None:
            uploader = self.hard_examples
            self.metrics.hard_examples_pending.labels(tier).set_function(
                lambda: uploader.pending)

    def _depth_of(self, priority: Priority) -> Callable[[], float]:
        return lambda: float(self.scheduler.snapshot().queue_depth_by_priority.get(priority, 0))

    def _on_breaker(self, node_id: str, old: str, new: str) -> None:
        self.metrics.breaker_state.labels(self.spec.tier.label, node_id).set(
            1.0 if new == "open" else 0.0)
        log.warning("breaker to %s: %s -> %s", node_id, old, new)
        self.refresh_view()

    def _initial_ms(self) -> float:
        return max((rt.info.latency_ms for rt in self.runtimes.values()), default=5.0)


def _batch_size(inputs: dict[str, np.ndarray]) -> int:
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


class _InstallsCollector:
    """Exports the manager's install counts (the core never calls the exporter)."""

    def __init__(self, models: ModelManager, tier: str) -> None:
        self._models = models
        self._tier = tier

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "tierlink_model_installs",
            "Model versions brought onto this node, by outcome: ok (verified, loaded, warmed "
            "up), rejected (failed verification), failed (unknown version, failed to load), "
            "crashed (the process died loading it), unreachable (repository; retried)",
            labels=["tier", "model", "outcome"])
        for (model, outcome), n in sorted(self._models.installs.items()):
            family.add_metric([self._tier, model, outcome], n)
        yield family


class _Observer:
    def __init__(self, metrics: NodeMetrics) -> None:
        self._m = metrics

    def escalated(self, model: str) -> None:
        self._m.escalations.labels(self._m.tier, model).inc()

    def fell_back(self, node_id: str, reason: str) -> None:
        self._m.fallbacks.labels(self._m.tier, node_id, reason).inc()

    def retried(self, node_id: str) -> None:
        self._m.retries.labels(self._m.tier, node_id).inc()

    def hedged(self, node_id: str, outcome: str) -> None:
        self._m.hedges.labels(self._m.tier, node_id, outcome).inc()


__all__ = ["NodeService"]


def _correctness(result: StepResult, labels: tuple[int, ...] | None) -> float:
    """How right an answer is, for a learning policy: the share of labels its top-1 meets
    when the request carried them, else its calibrated confidence (expected correctness)."""
    pred = result.outputs.get("label")
    if labels and pred is not None and np.asarray(pred).size == len(labels):
        return float(np.mean(np.asarray(pred).reshape(-1) == np.asarray(labels)))
    return result.outcome.confidence
