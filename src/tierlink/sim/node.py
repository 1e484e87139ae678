"""A simulated node: the live node's routing (``node/service.py``) on simulated time.

What it runs is the node's own code: the policies from ``tierlink.policy.REGISTRY`` (the
same objects a node creates, planning over the same ``ClusterView``), the dispatcher's steps
(``node/dispatcher.py``: escalation, fallback, retries within a budget, hedges, timeouts;
carried out here with callbacks, ``sim/dispatch.py``: each step raises at once or calls
back later),
the breaker board, the link estimators (``estimate/latency.py``, fed with the simulated
exchanges) and the scheduler (``node/scheduler.py``, workers on simulated time). What is
simulated is only what a node's environment does: a model's run time and answer
(``sim/compute.py``, ``sim/outcomes.py``), the wire (``sim/links.py``) and the registry's
staleness (``sim/fleet.py``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tierlink.core.types import (
    ClusterView,
    CodecPoint,
    LinkView,
    ModelView,
    NodeView,
    Outcome,
    Placement,
    Request,
    SplitPoint,
    Tier,
)
from tierlink.errors import (
    DeadlineExceeded,
    NoFeasiblePlacement,
    Refused,
    TierlinkError,
    UpstreamUnavailable,
)
from tierlink.estimate.cost import DAY_S
from tierlink.estimate.latency import LinkEstimator
from tierlink.node.admission import escalation_queue as shed_at
from tierlink.node.breaker import BreakerBoard, BreakerSettings, DispatchBreakers
from tierlink.node.dispatcher import Dispatcher, RetryBudget
from tierlink.node.heads import head_factor, head_key, scaled
from tierlink.node.hedging import Hedger
from tierlink.node.scheduler import SchedulerConfig
from tierlink.node.steps import Call, Inputs, StepResult, observed, sent_request
from tierlink.policy.ope import Logged
from tierlink.routing.deferral import deferral
from tierlink.routing.desk import PolicyDesk
from tierlink.routing.router import Router
from tierlink.sim.compute import ComputeModel, Reply, SimScheduler, Work
from tierlink.sim.dispatch import Chain, Done, SimRun
from tierlink.sim.hop import Exchanges, Hop
from tierlink.sim.http import HttpCosts
from tierlink.sim.links import SimLink
from tierlink.sim.power import DevicePower, PowerState

if TYPE_CHECKING:
    from tierlink.settings.routing import RoutingConfig
    from tierlink.sim.outcomes import Outcomes


@dataclass
class Counters:
    """What a run's dispatchers and receipts did (the live node's metrics, in one place),
    and the shadow log when a candidate policy runs in shadow mode."""

    violations: int = 0
    refusals: int = 0  # plans the routers refused for privacy
    shadow_log: list[Logged] = field(default_factory=list)
    escalated: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    retried: int = 0
    hedged: dict[str, int] = field(default_factory=dict)

    def escalated_(self, _model: str) -> None:
        self.escalated += 1

    def fell_back(self, _node: str, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def retried_(self, _node: str) -> None:
        self.retried += 1

    def hedged_(self, _node: str, outcome: str) -> None:
        self.hedged[outcome] = self.hedged.get(outcome, 0) + 1


class _Observer:
    def __init__(self, counters: Counters) -> None:
        self.escalated = counters.escalated_
        self.fell_back = counters.fell_back
        self.retried = counters.retried_
        self.hedged = counters.hedged_


class SimNode:
    def __init__(self, node_id: str, tier: Tier, models: Mapping[str, ModelView],
                 routing: RoutingConfig, outcomes: Mapping[str, Outcomes],
                 counters: Counters, rng: random.Random, *, workers: int = 1,
                 max_queue: int = 256, escalation_queue: int | None = None,
                 compute: ComputeModel | None = None,
                 http: HttpCosts | None = None, clock: Callable[[], float],
                 heads: Mapping[str, ModelView] | None = None) -> None:
        self.node_id, self.tier = node_id, tier
        self.models = dict(models)
        # models whose head this node runs for a split plan, with their split profiles
        # (every profiled cut open: the live node's warmer opens them as traffic comes)
        self.heads = dict(heads or {})
        self._heads_memo: tuple[float, tuple[ModelView, ...]] | None = None
        self.routing = routing
        self.outcomes = outcomes
        self.counters = counters
        self.rng = rng
        self.compute = compute or ComputeModel()
        self.http = http or HttpCosts()  # a forward's HTTP work (both ends), drawn per hop
        self.alive = True
        self.incarnation = 0  # grows at each crash: answers of an older one never arrive
        self._clock = clock
        self._policy_config = routing.policy_config()
        self.desk = PolicyDesk(node_id, self.tier, routing, self._count, self._policy_config)
        self.router = Router(self.desk, rng, refused=self._refused)
        self.scheduler = SimScheduler(SchedulerConfig(
            workers=workers, max_queue=max_queue,
            escalation_queue=shed_at(escalation_queue, workers)), clock=clock)
        self.scheduler.start()
        for name, m in self.models.items():
            self.scheduler.seed_service_ms(name, m.latency_ms / max(self.compute.speed, 1e-6))
        self.breakers = BreakerBoard(BreakerSettings(
            failure_threshold=routing.breaker.failure_threshold,
            cooldown_s=routing.breaker.cooldown_s,
            max_cooldown_s=routing.breaker.max_cooldown_s), clock=clock)
        self.links: dict[str, SimLink] = {}
        self.estimators: dict[str, LinkEstimator] = {}
        self.upstreams: dict[str, SimNode] = {}
        self.outstanding: dict[str, int] = {}
        self.hops = Exchanges(self.links, self.upstreams, self.http, rng, clock)
        # the dispatcher decides; this node carries its steps out (run_step)
        self.dispatcher = Dispatcher(node_id, tier, None, None, DispatchBreakers(self.breakers),
                                     RetryBudget(routing.retry_budget),
                                     _Observer(counters), clock,
                                     margin_ms=routing.reserve_ms,
                                     hedger=Hedger(routing.hedging))
        self._learned: tuple[float, ...] = ()
        self._learned_at = -1  # the scheduler's ``learned`` that the views below follow
        self._model_views: tuple[ModelView, ...] = ()
        self._heads_now: tuple[ModelView, ...] = ()
        self._card_ms = {name: m.latency_ms for name, m in self.models.items()}
        self._me: tuple[tuple[object, ...], NodeView] | None = None
        self.power: PowerState | None = None  # a device's battery and heat (sim/power.py)
        self.view = ClusterView.build(node_id, [self.me()], [])
        self.view_at = float("-inf")
        self.before_plan: Callable[[SimNode], None] = lambda _node: None  # view refresh

    def crash(self) -> None:
        self.alive = False
        self.incarnation += 1

    def restart(self) -> None:
        if self.power is None or not self.power.empty:  # a flat battery stays flat
            self.alive = True

    def with_power(self, power: DevicePower) -> None:
        self.power = PowerState(power, at=self._clock(), on_empty=self.crash)

    def connect(self, upstream: SimNode, link: SimLink) -> None:
        self.upstreams[upstream.node_id] = upstream
        self.links[upstream.node_id] = link
        hop = self._policy_config.estimates.hop_overhead_ms
        self.estimators[upstream.node_id] = LinkEstimator(
            LinkView(self.node_id, upstream.node_id, link.shape.rtt_ms,
                     link.shape.bandwidth_mbit or 1000.0, link.shape.loss),
            hop_overhead_ms=hop)

    # -- what the registry and the policy see ----------------------------------------------

    def me(self) -> NodeView:
        """This node as it is now (the same object while nothing it shows has changed)."""
        sched = self.scheduler
        if sched.learned != self._learned_at:  # models and heads follow what is learned
            self._learned_at = sched.learned
            self._relearn()
        state = None if self.power is None else self.power.device_state(self._clock())
        key = (sched.load(), self._model_views, self._heads_now, state)
        if self._me is None or self._me[0] != key:
            queued, inflight, workers = key[0]
            self._me = (key, NodeView(self.node_id, self.tier, self._model_views,
                                      queue_depth=queued, inflight=inflight, workers=workers,
                                      heads=self._heads_now, state=state))
        return self._me[1]

    def _relearn(self) -> None:
        """The models' views at their learned run times; the heads priced at this node's
        real speed, as the live node prices them (the same objects while the factor holds:
        the policy caches its pricing per profile)."""
        learned = tuple(self.scheduler.service_estimate_ms(name) for name in self.models)
        if learned != self._learned:
            self._learned = learned
            self._model_views = tuple(replace(m, latency_ms=ms) for m, ms
                                      in zip(self.models.values(), learned, strict=True))
        if not self.heads:
            return
        profiles = tuple(self.heads.values())
        factor = head_factor(profiles, self._card_ms,
                             self.scheduler.snapshot().service_ms_by_key)
        if self._heads_memo is None or self._heads_memo[0] != factor:
            self._heads_memo = (factor, scaled(profiles, factor))
        self._heads_now = self._heads_memo[1]

    def link_views(self) -> list[LinkView]:
        return [e.view() for e in self.estimators.values()]

    def refresh_view(self, others: list[NodeView], their_links: list[LinkView]) -> None:
        """Registry entries of the nodes this one can reach (as last heard), live state for
        itself, its own link estimates; breakers decide who counts as healthy."""
        healthy = self.breakers.healthy
        nodes = [self.me()] + [n if healthy(n.node_id) else replace(n, healthy=False)
                               for n in others if n.node_id != self.node_id]
        # Simulated time starts at midnight UTC: prices that change with the hour follow it.
        self.view = ClusterView.build(self.node_id, nodes, [*self.link_views(), *their_links],
                                      self.outstanding, self._clock() % DAY_S)
        self.view_at = self._clock()

    # -- a request arrives -----------------------------------------------------------------

    def _count(self, _privacy: str, verdict: str) -> None:
        """The desk's receipt verdicts (the live node's ``tierlink_inputs_received_total``)."""
        if verdict == "violation":
            self.counters.violations += 1

    def _refused(self, _privacy: str, _policy: str) -> None:
        """A plan the router refused for privacy (``tierlink_privacy_refusals_total``)."""
        self.counters.refusals += 1

    def deferral(self, req: Request) -> float:
        """How long an asynchronous ``req`` arriving here waits for cheaper prices (s)."""
        self.before_plan(self)
        policy, req = self.router.arrive(req)
        return deferral(policy, req, self.view, self.routing.cost).wait_s

    def handle(self, req: Request, inputs: Inputs, done: Done, chain: Chain) -> None:
        """What ``NodeService.infer_task`` does with a routed request: what is refused on
        arrival raises at once; the answer (or the error) goes to ``done`` later."""
        if self.power is not None:
            self.power.advance(self._clock())
        if not self.alive:
            raise UpstreamUnavailable(f"{self.node_id} is down")
        t0 = self._clock()
        policy, req = self.router.arrive(req)
        self.before_plan(self)
        view = self.view
        plan, decision = self.router.plan(policy, req, view)
        if plan.empty:
            raise NoFeasiblePlacement(f"{self.node_id}: {plan.reason}",
                                      request_id=req.request_id)
        label = int(self.outcomes[req.task].labels[int(inputs["sample"])])

        def observe(result: StepResult | None, latency_ms: float) -> None:
            outcome = result.outcome if result is not None else None
            correct = float(int(result.outputs["label"]) == label) if result else 0.0
            self.router.feedback(policy, plan, decision, req, view, outcome, correct,
                                 latency_ms)

        steps = self.dispatcher.steps(plan, req, inputs, t0 + req.deadline_ms / 1000.0)
        run = SimRun(self, observed(steps, t0, self._clock, observe), req, inputs, done)
        run.start()
        chain.now = run

    # -- the dispatcher's steps ------------------------------------------------------------

    def run_step(self, call: Call, req: Request, inputs: Inputs, done: Done,
                 chain: Chain) -> None:
        placement = call.placement
        if placement.kind == "local":
            self._run_local(placement, req, inputs, call.remaining_ms, done, chain)
            return
        req = sent_request(call, req)
        if placement.cut:
            self._run_split(placement, req, inputs, call.budget_ms, done, chain)
        else:
            self._run_remote(placement, req, inputs, call.budget_ms, done, chain)

    def _submit(self, seconds: float, req: Request, deadline_s: float, key: str,
                then: Callable[[Any, TierlinkError | None], None], chain: Chain) -> None:
        """A job of ``seconds`` on this node's scheduler (refused at once, or ``then``)."""
        reply = Reply(then, self.scheduler)
        reply.job = self.scheduler.admit(Work(seconds), priority=req.priority,
                                         deadline_s=deadline_s, future=reply, key=key,
                                         inline=False, optional=req.escalation)
        chain.now = reply

    def _run_local(self, placement: Placement, req: Request, inputs: Inputs,
                   remaining_ms: float, done: Done, chain: Chain) -> None:
        name = placement.model or ""
        model = self.models[name]
        task_outcomes = self.outcomes[model.task]
        pred, confidence = task_outcomes.answer(name, int(inputs["sample"]))
        seconds = self.compute.seconds(model.latency_ms, self.rng)
        if self.power is not None:
            self.power.advance(self._clock())
            seconds /= self.power.factor()

        def ran(_result: object, error: TierlinkError | None) -> None:
            if error is not None:
                done(None, error)
                return
            if self.power is not None:
                self.power.advance(self._clock(), busy_s=seconds)
            compute_ms = seconds * 1000.0
            bill = self.routing.cost.at(self.view.day_s).compute_bill(self.tier, compute_ms)
            outcome = Outcome(self.node_id, self.tier, name, (self.node_id,), confidence,
                              bill=bill, timings_ms={"compute_ms": compute_ms},
                              model_version=model.version)
            done(StepResult({"label": np.asarray(pred)}, outcome), None)

        self._submit(seconds, req, self._clock() + remaining_ms / 1000.0, name, ran, chain)

    def _run_remote(self, placement: Placement, req: Request, inputs: Inputs,
                    budget_ms: float, done: Done, chain: Chain) -> None:
        """What ``NodeService._run_remote`` does: forward with what is left of the deadline,
        learn the link from the exchange, add the transfer's cost."""
        up = placement.node_id
        link = self.estimators[up].view()
        send_ms = budget_ms - link.rtt_ms - self.routing.reserve_ms
        if send_ms <= 0:
            raise DeadlineExceeded(f"no time left for the hop to {up}")
        forwarded = replace(req, deadline_ms=send_ms, hops=req.hops + 1)
        self.outstanding[up] = self.outstanding.get(up, 0) + 1
        start = self._clock()

        def answered(result: StepResult, server_ms: float) -> None:
            total_ms = (self._clock() - start) * 1000.0
            self.estimators[up].observe(total_ms, server_ms, req.input_bytes)
            transfer = self.routing.cost.at(self.view.day_s).transfer_bill(placement.tier,
                                                                           req.input_bytes)
            out = result.outcome
            done(StepResult(result.outputs, replace(out, bill=out.bill + transfer)), None)

        def release() -> None:
            self.outstanding[up] -= 1

        def work(target: SimNode, then: Done, inner: Chain) -> None:
            target.handle(forwarded, inputs, then, inner)

        self.hops.exchange(up, req.input_bytes, work, Hop(budget_ms, answered, done, release),
                           chain)

    def _run_split(self, placement: Placement, req: Request, inputs: Inputs,
                   budget_ms: float, done: Done, chain: Chain) -> None:
        """What ``NodeService._run_split`` does: the head here (this node's scheduler, the
        profile's head time at this node's speed), encode, send the codec's payload, the
        tail upstream; the answer is the whole model's on that input."""
        model, up = placement.model or "", placement.node_id
        point = next(p for p in self.heads[model].splits if p.cut == placement.cut)
        codec = point.codec(placement.codec) or self._codec_estimate(point, placement.codec)
        started = self._clock()
        head_s = self.compute.seconds(point.head_ms, self.rng)
        encode_s = codec.encode_ms / 1000.0 / max(self.compute.speed, 1e-6)
        wire = codec.wire_bytes

        def tail(target: SimNode, then: Done, inner: Chain) -> None:
            target.run_tail(model, point, codec, req, then, inner)

        def encoded() -> None:
            left_ms = budget_ms - (self._clock() - started) * 1000.0 - self.routing.reserve_ms
            if left_ms <= self.estimators[up].view().rtt_ms:
                done(None, DeadlineExceeded(f"no time left to send features to {up}",
                                            before_hop=True))
                return
            sent = self._clock()

            def answered(tail_compute_ms: float, tail_ms: float) -> None:
                total_ms = (self._clock() - sent) * 1000.0
                self.estimators[up].observe(total_ms, tail_ms, wire)
                pred, confidence = self.outcomes[req.task].answer(model, int(inputs["sample"]))
                head_ms = head_s * 1000.0
                bill = self.routing.cost.at(self.view.day_s).split_bill(
                    self.tier, head_ms, placement.tier, wire, tail_compute_ms)
                outcome = Outcome(up, placement.tier, model, (self.node_id, up), confidence,
                                  bill=bill, timings_ms={
                                      "head_ms": head_ms, "encode_ms": encode_s * 1000.0,
                                      "tail_rtt_ms": total_ms, "tail_ms": tail_ms,
                                      "split_bytes": float(wire), "est_ms": placement.est_ms},
                                  split=f"{placement.cut}/{placement.codec}")
                done(StepResult({"label": np.asarray(pred)}, outcome), None)

            self.hops.exchange(up, wire, tail, Hop(left_ms, answered, done), chain)

        def headed(_result: object, error: TierlinkError | None) -> None:
            if error is not None:
                done(None, error)
            elif encode_s:
                chain.now = asyncio.get_running_loop().call_later(encode_s, encoded)
            else:
                encoded()

        try:
            self._submit(head_s, req, started + budget_ms / 1000.0, head_key(model, placement.cut),
                         headed, chain)
        except Refused as exc:  # refused by this node's own scheduler: not the upstream
            exc.details["before_hop"] = True
            raise

    def _codec_estimate(self, point: SplitPoint, spec: str) -> CodecPoint:
        """A codec the profile did not measure at this cut, as the policy prices it (the
        fleet's codec profile: size ratio, cost per FP32 kilobyte)."""
        found = next((c for c in self._policy_config.split_codecs if c.spec == spec), None)
        kb = point.feature_bytes / 1000.0
        if found is None:
            return CodecPoint(spec, point.feature_bytes, 0.0, 0.0)
        return CodecPoint(spec, int(point.feature_bytes / found.ratio),
                          found.encode_ms_per_kb * kb, found.decode_ms_per_kb * kb)

    def run_tail(self, model: str, point: SplitPoint, codec: CodecPoint, req: Request,
                 done: Done, chain: Chain) -> None:
        """A split plan's second half on this node: decode, then the tail, on its
        scheduler; ``done`` gets the ms it computed."""
        tail = next((p for p in self.models[model].splits if p.cut == point.cut), point)
        seconds = self.compute.seconds(tail.tail_ms + codec.decode_ms, self.rng)

        def ran(_result: object, error: TierlinkError | None) -> None:
            if error is not None:
                done(None, error)
            else:
                done(seconds * 1000.0, None)

        self._submit(seconds, req, self._clock() + req.deadline_ms / 1000.0,
                     f"{model}@tail:{point.cut}", ran, chain)
