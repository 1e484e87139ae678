"""A node's split plans: the model segments it holds (tails of the models it serves, heads
of those its spec lists under ``heads:``), its heads priced for the policy at the node's
real speed with only the open cuts, both halves of a plan (head here, encode, send; tail
there) and the warmer that opens the cuts the policy would pick before a request needs one.

``NodeService`` owns one and hands it what it shares: its scheduler, its upstreams, its
client, its view.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import (
    ClusterView,
    LinkView,
    ModelView,
    Outcome,
    Placement,
    Plan,
    Priority,
    Request,
    Tier,
)
from tierlink.errors import (
    DeadlineExceeded,
    InvalidRequest,
    ModelNotFound,
    Refused,
    TensorError,
    TierlinkError,
)
from tierlink.estimate.latency import LinkEstimator
from tierlink.models.exits import ExitHead, ExitsModel, is_exit_card
from tierlink.models.onnx import OnnxModel
from tierlink.models.runtime import ModelInfo, ModelRuntime, softmax_confidence
from tierlink.node import protocol
from tierlink.node.dispatcher import StepResult
from tierlink.node.heads import head_factor, head_key, scaled
from tierlink.node.scheduler import Scheduler
from tierlink.node.spec import ModelSource, UpstreamSpec
from tierlink.policy.placement import split_plans
from tierlink.settings.routing import RoutingConfig
from tierlink.split.runtime import SplitSessions
from tierlink.telemetry import tracing
from tierlink.telemetry.metrics import NodeMetrics
from tierlink.transport.client import OipClient

__all__ = ["SplitPlans", "Upstream"]

log = logging.getLogger("tierlink.node")

PROBE_SMALL, PROBE_LARGE = 64, 64 * 1024  # bytes: two sizes give RTT and bandwidth
WARM_CUTS = 1  # cuts of the best split plans toward each upstream whose heads are opened
WARM_EVERY_S = 1.0  # how often the split warmer looks at what the policy would pick
WARM_DEMAND_S = 120.0  # the warmer opens cuts of a task routed here within this long


@dataclass(slots=True)
class Upstream:
    """One of a node's upstreams: where it is and what the node has learned of the link."""

    spec: UpstreamSpec
    estimator: LinkEstimator
    last_seen: float = float("-inf")  # when traffic last measured this link (node clock)
    last_used: float = float("-inf")  # when its connection last carried anything (KeepWarm)

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def node_id(self) -> str:
        return self.spec.node_id

    @staticmethod
    def maker(node_id: str, routing: RoutingConfig) -> Callable[[UpstreamSpec], Upstream]:
        """What makes ``node_id``'s upstream toward a chosen node: a fresh link estimator
        seeded with the spec's RTT and bandwidth."""
        hop_ms = routing.policy_config().estimates.hop_overhead_ms

        def make(u: UpstreamSpec) -> Upstream:
            return Upstream(u, LinkEstimator(
                LinkView(node_id, u.node_id, u.rtt_ms, u.bandwidth_mbit, u.loss),
                hop_overhead_ms=hop_ms))
        return make


class SplitPlans:
    def __init__(self, node_id: str, tier: Tier, runtimes: Mapping[str, ModelRuntime],
                 heads: tuple[ModelSource, ...], *, scheduler: Scheduler, client: OipClient,
                 routing: RoutingConfig, metrics: NodeMetrics, clock: Callable[[], float],
                 upstreams: Mapping[str, Upstream], view: Callable[[], ClusterView],
                 refresh_view: Callable[[], None],
                 count_exits: Callable[[str, dict[str, np.ndarray]], None],
                 work_dir: Path | None = None) -> None:
        self._node_id, self._tier = node_id, tier
        self._runtimes = runtimes  # the model manager's dict: swapped in place at a switch
        self._spec_heads = heads
        self._scheduler, self._client, self._routing = scheduler, client, routing
        self._metrics, self._clock, self._upstreams = metrics, clock, upstreams
        self._view, self._refresh_view, self._count_exits = view, refresh_view, count_exits
        self._split_dir = _fresh_dir(work_dir, node_id)
        self.sessions = self._make_sessions()
        # Head models with this machine's split profile (`tierlink split profile`): what
        # the policy prices the first half of a split plan with.
        infos = [self._head_info(h.name, Path(h.card)) for h in heads]  # read once
        self.heads = tuple(info.view() for info in infos)
        self._head_temperature = {info.name: info.temperature for info in infos}
        self._scaled_memo: tuple[float, tuple[ModelView, ...]] | None = None
        self._open_memo: tuple[tuple[ModelView, ...], tuple[frozenset[str], ...],
                               tuple[ModelView, ...]] | None = None
        self._unwarmable: set[tuple[str, str]] = set()  # (model, cut) that failed to open
        self._demand: dict[str, float] = {}  # task -> when a request for it was last routed
        self._tasks: list[asyncio.Task[None]] = []  # the warmer, the link prober

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """The warmer (a node with heads) and the link prober (the same, when
        ``routing.probe_idle_s`` > 0): split plans are priced with the links' bandwidth.
        Both look at the upstreams of the moment (they come and go with the registry)."""
        if self.heads:
            self._tasks.append(asyncio.create_task(self._warm_loop(), name="split-warmer"))
        if self._routing.probe_idle_s > 0 and self._spec_heads:
            self._tasks.append(asyncio.create_task(self._probe_loop(), name="link-probe"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shutil.rmtree(self._split_dir, ignore_errors=True)

    def routed(self, task: str, at: float) -> None:
        """A request for ``task`` was routed here: the warmer opens cuts of tasks in use."""
        self._demand[task] = at

    def switched(self, name: str, rt: ModelRuntime) -> None:
        """A new active version: split tails are cut from its graph from now on."""
        if isinstance(rt, OnnxModel):
            self.sessions[name] = SplitSessions(
                name, rt.path, self._split_dir / f"{name}@{rt.info.version}")
        elif isinstance(rt, ExitsModel):  # its heads and tails are its own segments
            self.sessions[name] = rt

    def view_heads(self, service_ms: Mapping[str, float]) -> tuple[ModelView, ...]:
        """The heads as the policy should see them: at this node's speed, open cuts only."""
        return self.open_heads(self.scaled_heads(service_ms))

    def open_cuts(self) -> dict[str, list[str]]:
        return {h.name: sorted(p.cut for p in h.splits if self.is_open(h.name, p.cut))
                for h in self.heads}

    def forced_plan(self, req: Request, text: str, view: ClusterView, allowed: bool) -> Plan:
        """The one-placement plan a request asked for with ``tierlink.split=NODE/CUT/CODEC``
        (benchmarks measure every cut this way); allowed where policy overrides are."""
        if not allowed:
            raise InvalidRequest(f"this fleet does not allow choosing a split per request "
                                 f"({protocol.SPLIT})",
                                 hint="set routing.allow_policy_override in the fleet file")
        node, _, rest = text.partition("/")
        cut, _, codec = rest.rpartition("/")
        up = self._upstreams.get(node)
        target = view.nodes.get(node)
        if up is None or target is None or not cut or not codec:
            raise InvalidRequest(f"{protocol.SPLIT}={text!r}: expected NODE/CUT/CODEC with "
                                 f"NODE one of this node's upstreams {sorted(self._upstreams)}")
        models = [m for m in target.models if m.task == req.task and m.name in self.sessions]
        if not models:
            raise InvalidRequest(f"{node} serves no model of {req.task!r} whose head "
                                 f"{self._node_id} holds")
        # What the policy expects of this plan (0 when it would not consider it), so a
        # benchmark can compare every plan's estimate with what it really took.
        plans = split_plans(view.nodes[self._node_id], target, models[0], view,
                            self._routing.policy_config())
        est = next((p.total_ms - p.head_ms for p in plans if p.cut == cut and p.codec == codec),
                   0.0)  # like a policy's split placement: the part after the head
        return Plan((Placement("remote", node, target.tier, models[0].name, est_ms=est,
                               cut=cut, codec=codec),), "forced_split", "forced by the request")

    # -- link probes -----------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        """Keep idle links measured: a link that carried no traffic for ``probe_idle_s``
        gets a small and a large probe, so its bandwidth estimate (what split plans are
        priced with) follows the link even while no request uses it."""
        idle = self._routing.probe_idle_s
        while True:
            await asyncio.sleep(idle / 2)
            for up in list(self._upstreams.values()):
                if self._clock() - up.last_seen >= idle:
                    await self._probe(up)

    async def _probe(self, up: Upstream) -> None:
        for nbytes in (PROBE_SMALL, PROBE_LARGE):
            start = self._clock()
            try:
                await self._client.probe(up.spec.url, nbytes, timeout_s=5.0,
                                         peer=up.spec.node_id)
            except TierlinkError:
                return  # an unreachable upstream is the breakers' business, not the probe's
            up.estimator.observe((self._clock() - start) * 1000.0, 0.0, nbytes, probe=True)
        up.last_seen = up.last_used = self._clock()

    # -- segments, tails and heads -----------------------------------------------------------

    def _make_sessions(self) -> dict[str, SplitSessions | ExitsModel]:
        """Segments of every model served here (tails) and of every head model; a
        multi-exit model is split at its exit boundaries by its own runtime."""
        sessions: dict[str, SplitSessions | ExitsModel] = {
            name: SplitSessions(name, rt.path, self._split_dir / name)
            for name, rt in self._runtimes.items() if isinstance(rt, OnnxModel)}
        for name, rt in self._runtimes.items():
            if isinstance(rt, ExitsModel):
                sessions[name] = rt
        for head in self._spec_heads:
            if head.name in sessions:
                continue
            sessions[head.name] = (ExitsModel(Path(head.card), package=Path(head.onnx))
                                   if is_exit_card(Path(head.card))
                                   else SplitSessions(head.name, Path(head.onnx),
                                                      self._split_dir / head.name))
        return sessions

    def _head_info(self, name: str, card: Path) -> ModelInfo:
        executor = self.sessions.get(name)
        if isinstance(executor, ExitsModel):
            return executor.info
        return ModelInfo.from_card(card)

    async def open_tail(self, name: str, cut: str) -> None:
        """Open the segments of ``name`` at ``cut`` (cut the model, open its sessions) in a
        thread; nothing to do when they are open. Unknown model or cut: a clear error."""
        sessions = self.sessions.get(name)
        if sessions is None:
            raise ModelNotFound(f"{self._node_id} serves no model {name!r} to split",
                                hint="GET /v2/repository/index lists the models served here")
        if not sessions.ready(cut, "tail"):
            await asyncio.to_thread(sessions.prepare, cut, "tail")

    async def run_tail(self, name: str, inputs: dict[str, np.ndarray], params: dict[str, Any],
                        priority: Priority, deadline_s: float | None,
                        ) -> tuple[dict[str, np.ndarray], float]:
        """A split plan's second half: decode the features, run the tail of ``name``;
        (its outputs, the tail's compute ms)."""
        from tierlink.split.codecs import decode_any

        sessions = self.sessions.get(name)
        if sessions is None:
            raise ModelNotFound(f"{self._node_id} cannot run a tail of {name!r}")
        if len(inputs) != 1 or next(iter(inputs.values())).dtype != np.uint8:
            raise TensorError("a split request carries one UINT8 tensor: the encoded features",
                              hint="encode them with tierlink.split.codecs")
        with tracing.stage("tierlink.split.decode", {"tierlink.model": name}):
            features = decode_any(next(iter(inputs.values())).tobytes())
        cut = str(params[protocol.CUT])
        if not sessions.ready(cut, "tail"):  # first use: not learned as the tail's time
            await asyncio.to_thread(sessions.prepare, cut, "tail")

        timing: list[float] = []

        def call() -> dict[str, np.ndarray]:
            start = time.perf_counter()
            try:
                return sessions.tail(cut, features)
            finally:
                timing.append((time.perf_counter() - start) * 1000.0)

        out: dict[str, np.ndarray] = await self._scheduler.submit(
            call, priority=priority, deadline_s=deadline_s, key=f"{name}@tail:{cut}")
        return out, timing[0]

    async def run_split(self, placement: Placement, req: Request,
                         inputs: dict[str, np.ndarray], budget_ms: float) -> StepResult:
        """A split plan's first half here: head, encode, send; the tail runs upstream."""
        model = placement.model or ""
        sessions = self.sessions.get(model)
        if sessions is None:
            raise ModelNotFound(f"{self._node_id} holds no head of {model!r}",
                                hint="list the model under the node's `heads:`")
        up = self._upstreams[placement.node_id]
        x = next(iter(inputs.values()))
        started = self._clock()
        cold = not sessions.ready(placement.cut)
        if cold:  # first use: not learned as the head's time
            await asyncio.to_thread(sessions.prepare, placement.cut)
        head_from = self._clock()

        def head() -> Any:
            return sessions.head(placement.cut, x)

        try:
            head_out = await self._scheduler.submit(head, priority=req.priority,
                                                   deadline_s=started + budget_ms / 1000.0,
                                                   key=head_key(model, placement.cut))
        except Refused as exc:  # refused by this node's own scheduler: not the upstream
            exc.details["before_hop"] = True
            raise
        head_ms = (self._clock() - head_from) * 1000.0
        # A multi-exit model's head answers what its exits before the cut can; only the
        # rest of the batch is sent on.
        exited = head_out if isinstance(head_out, ExitHead) else None
        features: np.ndarray | None = exited.features if exited is not None else head_out
        if exited is not None:
            self._count_exits(model, {"exit": np.array(exited.exits, dtype=np.int64)})
        if features is None:
            assert exited is not None  # only an early-exit head sends nothing
            return self._exited_here(model, exited, head_ms)
        logits, timings, wire = await self._send_features(placement, req, up, features,
                                                          started, budget_ms, learn=not cold)
        probs, conf = softmax_confidence(logits, self._temperature_of(model))
        if exited is not None:
            probs = exited.merge(probs)
            conf = probs.max(axis=1)
        bill = self._routing.cost.at(self._view().day_s).split_bill(
            self._tier, head_ms, placement.tier, wire, timings["tail_compute_ms"])
        outcome = Outcome(placement.node_id, placement.tier, model,
                          (self._node_id, placement.node_id), float(conf.min()), bill=bill,
                          timings_ms={"head_ms": head_ms, **timings,
                                      "est_ms": placement.est_ms},
                          split=f"{placement.cut}/{placement.codec}")
        self._metrics.split_requests.labels(self._tier.label, model,
                                           placement.codec).inc()
        return StepResult({"probabilities": probs,
                           "label": probs.argmax(axis=1).astype(np.int64)}, outcome)

    async def _send_features(self, placement: Placement, req: Request, up: Upstream,
                             features: np.ndarray, started: float, budget_ms: float,
                             *, learn: bool = True) -> tuple[np.ndarray, dict[str, float], int]:
        """Encode the cut tensor, send it to the tail's node: (its logits, timings, bytes).
        ``learn`` False: the exchange does not teach the link estimate (it followed this
        node opening the cut: on a CPU quota, that burst stalls the send for most of a
        period, and a link priced at such a figure would not be tried again)."""
        from tierlink.split.codecs import get_codec

        encoding = self._clock()
        with tracing.stage("tierlink.split.encode", {"tierlink.codec": placement.codec,
                                                     "tierlink.cut": placement.cut}) as span:
            payload = np.frombuffer(get_codec(placement.codec).encode(features), dtype=np.uint8)
            tracing.set_attributes(span, {"tierlink.bytes": int(payload.nbytes)})
        encode_ms = (self._clock() - encoding) * 1000.0
        left_ms = budget_ms - (self._clock() - started) * 1000.0 - self._routing.reserve_ms
        if left_ms <= up.estimator.view().rtt_ms:
            raise DeadlineExceeded(f"no time left to send features to {placement.node_id}",
                                   before_hop=True)
        sent = self._clock()
        with tracing.stage("tierlink.split.transfer", {
                "tierlink.peer": placement.node_id, "tierlink.bytes": int(payload.nbytes),
                "tierlink.cut": placement.cut, "server.address": up.spec.url}):
            params = {**protocol.forward_params(req, left_ms, tracing.current_traceparent()),
                      protocol.CUT: placement.cut, protocol.CODEC: placement.codec}
            resp = await self._client.infer(up.spec.url, placement.model or "",
                                            {"features": payload}, params,
                                            timeout_s=left_ms / 1000.0, peer=placement.node_id)
        total_ms = (self._clock() - sent) * 1000.0
        tail_ms = float(resp.parameters.get(protocol.SERVER_MS, 0.0))
        # What the tail computed (an older node reports only its time: queue + compute)
        tail_compute_ms = float(resp.parameters.get(protocol.COMPUTE_MS, tail_ms))
        if learn:
            up.estimator.observe(total_ms, tail_ms, payload.nbytes)
        up.last_seen = up.last_used = self._clock()
        timings = {"encode_ms": encode_ms, "tail_rtt_ms": total_ms, "tail_ms": tail_ms,
                   "tail_compute_ms": tail_compute_ms, "split_bytes": float(payload.nbytes)}
        return next(iter(resp.outputs.values())), timings, int(payload.nbytes)

    def _exited_here(self, model: str, head: ExitHead, head_ms: float) -> StepResult:
        """A split plan of a multi-exit model whose exits before the cut answered every
        sample: nothing is sent; the answer is this node's."""
        probs = np.stack([a.probs for a in head.answers]).astype(np.float32)
        outcome = Outcome(self._node_id, self._tier, model, (self._node_id,),
                          float(probs.max(axis=1).min()),
                          bill=self._routing.cost.at(self._view().day_s).compute_bill(
                              self._tier, head_ms),
                          timings_ms={"head_ms": head_ms, "exit": float(max(head.exits))})
        return StepResult({"probabilities": probs,
                           "label": probs.argmax(axis=1).astype(np.int64)}, outcome)

    def _temperature_of(self, model: str) -> float:
        if model in self._head_temperature:
            return self._head_temperature[model]
        rt = self._runtimes.get(model)
        return rt.info.temperature if rt else 1.0

    def scaled_heads(self, service_ms: Mapping[str, float]) -> tuple[ModelView, ...]:
        # The split profile's own whole-model time is the fairest yardstick (same machine,
        # same timing run as the head latencies); the card's latency otherwise.
        card_ms = {name: rt.info.profile_ms or rt.info.latency_ms
                   for name, rt in self._runtimes.items()}
        factor = head_factor(self.heads, card_ms, service_ms)
        if self._scaled_memo is None or self._scaled_memo[0] != factor:
            self._scaled_memo = (factor, scaled(self.heads, factor))
        return self._scaled_memo[1]

    def open_heads(self, heads: tuple[ModelView, ...]) -> tuple[ModelView, ...]:
        """``heads`` with only the cuts whose segments are open here: a cold cut's first
        call would pay for cutting the model and opening its sessions (a second or more
        under a CPU quota). The split warmer opens the cuts the policy would pick. The same
        objects while neither the heads nor the open cuts change (the policy caches its
        pricing per profile)."""
        opened = tuple(frozenset(p.cut for p in h.splits if self.is_open(h.name, p.cut))
                       for h in heads)
        memo = self._open_memo
        if memo is not None and memo[0] is heads and memo[1] == opened:
            return memo[2]
        out = tuple(replace(h, splits=tuple(p for p in h.splits if p.cut in cuts))
                    for h, cuts in zip(heads, opened, strict=True))
        self._open_memo = (heads, opened, out)
        return out

    def is_open(self, model: str, cut: str) -> bool:
        sessions = self.sessions.get(model)
        return sessions is not None and sessions.ready(cut)

    async def _warm_loop(self) -> None:
        """Keep the heads of the cuts the policy would pick open, so no request pays for
        opening one: every ``WARM_EVERY_S``, open (in a thread, one at a time) the first
        cold cut among the best ``WARM_CUTS`` toward each upstream, priced as if every
        profiled cut were open. Until a cut is open the policy does not consider it.
        Only for tasks routed here within ``WARM_DEMAND_S``: opening a cut is a burst of
        CPU (and GIL) that a throttled device's other work would feel, so it is spent when
        the task is in use, not at start for a task that may never come."""
        while True:
            await asyncio.sleep(WARM_EVERY_S)
            cold = [mc for mc in self._cuts_wanted()
                    if not self.is_open(*mc) and mc not in self._unwarmable]
            if not cold:
                continue
            model, cut = cold[0]
            try:
                await asyncio.to_thread(self.sessions[model].prepare, cut)
                await self._open_tails(model, cut)
            except Exception:  # a cut that cannot be opened is not retried
                self._unwarmable.add((model, cut))
                log.exception("cannot open the split of %s at %s", model, cut)
                continue
            log.info("opened the split segments of %s at %s", model, cut)
            self._refresh_view()

    async def _open_tails(self, model: str, cut: str) -> None:
        """Ask every upstream that serves ``model`` to open its tail at ``cut`` too. One
        that cannot be reached opens it on first use instead (its breaker's business)."""
        for up_id, up in self._upstreams.items():
            node = self._view().nodes.get(up_id)
            if node is None or not any(m.name == model for m in node.models):
                continue
            try:
                await self._client.open_split(up.spec.url, model, cut, timeout_s=30.0,
                                              peer=up_id)
            except TierlinkError as exc:
                log.warning("could not ask %s to open %s at %s: %s", up_id, model, cut, exc)

    def _cuts_wanted(self) -> list[tuple[str, str]]:
        """(model, cut) of the best ``WARM_CUTS`` split plans toward each upstream over the
        live view, as if every profiled cut were open; best first."""
        me = self._view().nodes.get(self._node_id)
        if me is None:
            return []
        service_ms = self._scheduler.snapshot().service_ms_by_key
        now = self._clock()
        heads = tuple(h for h in self.scaled_heads(service_ms)
                      if now - self._demand.get(h.task, -math.inf) <= WARM_DEMAND_S)
        if not heads:
            return []
        every = replace(me, heads=heads)
        cfg = self._routing.policy_config()
        wanted: list[tuple[str, str]] = []
        ups = [self._view().nodes[u] for u in self._upstreams if u in self._view().nodes]
        for up in ups:
            for head in heads:
                model = next((m for m in up.models if m.name == head.name), None)
                plans = split_plans(every, up, model, self._view(), cfg) if model else []
                cuts = list(dict.fromkeys(p.cut for p in plans))[:WARM_CUTS]
                wanted += [(head.name, cut) for cut in cuts]
        return list(dict.fromkeys(wanted))


def _fresh_dir(work_dir: Path | None, node_id: str) -> Path:
    """Where cut models go: ``work_dir/splits`` (the node's state directory, emptied of what
    an earlier run — one killed before it could clean up — left there), else a temporary
    directory. ``stop`` removes it either way."""
    if work_dir is None:
        return Path(tempfile.mkdtemp(prefix=f"tierlink-{node_id}-split-"))
    path = work_dir / "splits"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
