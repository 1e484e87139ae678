"""The built-in placement policy: hard constraints first, then a weighted score.

For a request at node N the policy considers three kinds of option:

* ``local``   — run N's own model variant and answer, whatever its confidence;
* ``cascade`` — run the local model, escalate to an upstream node when the calibrated
  confidence is below the model's threshold;
* ``remote``  — send the request upstream at once.

Constraints remove options before anything is scored: privacy (``local`` inputs never leave
the origin device, ``site`` inputs never reach the cloud), model availability, health (open
circuit breakers) and deadline feasibility (the worst path an option can take must fit the
remaining budget). Inside a tier, power-of-two choices picks the node with the shorter
expected wait; the other sample becomes a fallback. An upstream option is valued by what the
upstream node's own policy would do with the request (the same code, one level up), so a
device can weigh "edge, which may itself escalate to the cloud" without micromanaging it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tierlink.core.types import (
    ClusterView,
    ModelView,
    NodeView,
    Placement,
    Plan,
    Request,
)
from tierlink.estimate.latency import queue_wait_ms, transfer_ms
from tierlink.policy.base import PolicyConfig


@dataclass(frozen=True, slots=True)
class Estimate:
    """Expected figures of one option; ``worst_ms`` assumes every cascade stage escalates."""

    latency_ms: float
    worst_ms: float
    cost: float
    accuracy: float


@dataclass(frozen=True, slots=True)
class Option:
    label: str
    placements: tuple[Placement, ...]
    est: Estimate
    spares: tuple[Placement, ...] = ()  # power-of-two losers, tried on failure
    model: ModelView | None = None  # the local model, for its cascade profile


def hard_slice_accuracy(upstream_accuracy: float, escalated_share: float) -> float:
    """Accuracy an upstream model reaches on the inputs a cascade escalates to it.

    Those inputs are the hard ones, so its overall accuracy is optimistic. The pessimistic
    bound puts all of its errors inside the escalated slice; we take the midpoint of the two
    until joint profiles (calibration issue) replace this heuristic.
    """
    if escalated_share <= 0:
        return upstream_accuracy
    pessimistic = max(0.0, 1.0 - (1.0 - upstream_accuracy) / escalated_share)
    return 0.5 * (upstream_accuracy + pessimistic)


class TierlinkPolicy:
    """The default policy (registered as ``"tierlink"``)."""

    name = "tierlink"
    respects_privacy = True
    respects_deadline = True

    def __init__(self, config: PolicyConfig) -> None:
        self._cfg = config

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan:
        options = self._options(view.self_id, request, view, request.deadline_ms, request.hops, rng)
        feasible = [o for o in options if o.est.worst_ms <= request.deadline_ms]
        if not feasible:
            return Plan((), self.name, reason=self._why_none(request, view, options))
        ref_cost = max(o.est.cost for o in feasible)
        ranked = sorted(feasible, key=lambda o: -self._score(o.est, request.deadline_ms, ref_cost))
        return Plan(merge_options(ranked), self.name, reason=ranked[0].label)

    # -- options -----------------------------------------------------------------------

    def _options(
        self, node_id: str, req: Request, view: ClusterView, budget: float, hops: int,
        rng: random.Random,
    ) -> list[Option]:
        node = view.nodes[node_id]
        local = self._local(node, req, view)
        options = [local] if local else []
        if hops >= self._cfg.max_hops:
            return options
        for tier, ids in view.upstream.get(node_id, {}).items():
            if not req.privacy.allows(tier, at_origin=False):
                continue
            remote = self._remote_choice(node, ids, req, view, budget, hops, rng)
            if remote is None:
                continue
            options.append(remote)
            cascade = self._cascade(local, remote) if local else None
            if cascade:
                options.append(cascade)
        return options

    def _local(self, node: NodeView, req: Request, view: ClusterView) -> Option | None:
        model = node.model_for(req.task, req.version)
        if model is None or not req.privacy.allows(node.tier, at_origin=node.node_id == req.origin):
            return None
        outstanding = 0 if node.node_id == view.self_id else view.outstanding.get(node.node_id, 0)
        latency = queue_wait_ms(node, model, outstanding) + model.latency_ms
        est = Estimate(latency, latency, self._cfg.cost.compute(node.tier, model.latency_ms),
                       model.accuracy)
        placement = Placement("local", node.node_id, node.tier, model.name, None,
                              est.latency_ms, est.cost, est.accuracy)
        return Option("local", (placement,), est, model=model)

    def _remote_choice(
        self, node: NodeView, ids: tuple[str, ...], req: Request, view: ClusterView,
        budget: float, hops: int, rng: random.Random,
    ) -> Option | None:
        pick, spare = two_choices(ids, view, req.task, rng)
        if pick is None:
            return None
        est = self._remote_estimate(node, pick, req, view, budget, hops, rng)
        if est is None:
            return None
        placement = Placement("remote", pick.node_id, pick.tier, None, None,
                              est.latency_ms, est.cost, est.accuracy)
        spares = (Placement("remote", spare.node_id, spare.tier),) if spare else ()
        return Option(f"remote:{pick.tier.label}", (placement,), est, spares)

    def _remote_estimate(
        self, node: NodeView, up: NodeView, req: Request, view: ClusterView, budget: float,
        hops: int, rng: random.Random,
    ) -> Estimate | None:
        link = view.link(node.node_id, up.node_id)
        if link is None:
            return None
        params = self._cfg.estimates
        sent = req.input_bytes + params.request_overhead_bytes
        hop_ms = transfer_ms(sent + params.response_bytes, link) + params.hop_overhead_ms
        sub = self._best(up.node_id, req, view, budget - hop_ms, hops + 1, rng)
        if sub is None:
            return None
        return Estimate(hop_ms + sub.latency_ms, hop_ms + sub.worst_ms,
                        self._cfg.cost.transfer(up.tier, sent) + sub.cost, sub.accuracy)

    def _best(
        self, node_id: str, req: Request, view: ClusterView, budget: float, hops: int,
        rng: random.Random,
    ) -> Estimate | None:
        """What ``node_id``'s policy would do with the request: its best feasible option."""
        feasible = [o for o in self._options(node_id, req, view, budget, hops, rng)
                    if o.est.worst_ms <= budget]
        if not feasible:
            return None
        ref_cost = max(o.est.cost for o in feasible)
        return max(feasible, key=lambda o: self._score(o.est, budget, ref_cost)).est

    def _cascade(self, local: Option, remote: Option) -> Option | None:
        first = local.placements[0]
        threshold = self._cfg.threshold_for(first.model or "")
        point = local.model.cascade_at(threshold) if local.model else None
        if point is None:
            return None
        share, answered_acc = point.answered_share, point.answered_accuracy
        lo, up = local.est, remote.est
        escalated = 1.0 - share
        est = Estimate(
            latency_ms=lo.latency_ms + escalated * up.latency_ms,
            worst_ms=lo.latency_ms + up.worst_ms,
            cost=lo.cost + escalated * up.cost,
            accuracy=share * answered_acc + escalated * hard_slice_accuracy(up.accuracy, escalated),
        )
        staged = Placement("local", first.node_id, first.tier, first.model, threshold,
                           lo.latency_ms, lo.cost, lo.accuracy)
        return Option(f"cascade:{remote.placements[0].tier.label}",
                      (staged, *remote.placements), est, remote.spares)

    # -- scoring -----------------------------------------------------------------------

    def _score(self, est: Estimate, deadline_ms: float, ref_cost: float) -> float:
        w = self._cfg.weights
        latency_term = est.latency_ms / deadline_ms if deadline_ms > 0 else 1.0
        cost_term = est.cost / ref_cost if ref_cost > 0 else 0.0
        return w.accuracy * 100.0 * est.accuracy - w.latency * latency_term - w.cost * cost_term

    def _why_none(self, req: Request, view: ClusterView, options: list[Option]) -> str:
        if not options:
            return (f"no node reachable from {view.self_id} holds a model for task "
                    f"{req.task!r}{_version(req)} that privacy {req.privacy.value!r} allows")
        fastest = min(options, key=lambda o: o.est.worst_ms)
        return (f"deadline {req.deadline_ms:.1f} ms cannot be met: the fastest option "
                f"({fastest.label} via {fastest.placements[0].node_id}) needs "
                f"{fastest.est.worst_ms:.1f} ms")


def _version(req: Request) -> str:
    return f" version {req.version!r}" if req.version else ""


def two_choices(
    ids: tuple[str, ...], view: ClusterView, task: str, rng: random.Random
) -> tuple[NodeView | None, NodeView | None]:
    """Power of two choices among healthy nodes of one tier: (shorter wait, the other)."""
    if len(ids) > 2:
        sample = rng.sample(ids, 2)
        healthy = [view.nodes[i] for i in sample if view.nodes[i].healthy]
        if len(healthy) < 2:  # rare: fall back to a scan so a dead pair never hides the rest
            healthy = [view.nodes[i] for i in ids if view.nodes[i].healthy]
            healthy = rng.sample(healthy, min(2, len(healthy)))
    else:
        healthy = [view.nodes[i] for i in ids if view.nodes[i].healthy]
    if not healthy:
        return None, None
    if len(healthy) == 1:
        return healthy[0], None
    a, b = healthy[0], healthy[1]
    if _wait(b, view, task) < _wait(a, view, task):
        a, b = b, a
    return a, b


def _wait(node: NodeView, view: ClusterView, task: str) -> float:
    model = node.model_for(task)
    outstanding = view.outstanding.get(node.node_id, 0)
    if model is None:
        return float(node.queue_depth + outstanding)
    return queue_wait_ms(node, model, outstanding)


def merge_options(ranked: list[Option]) -> tuple[Placement, ...]:
    """The best option's placements and spares, then every other option's first-choice
    nodes as plain fallbacks (a local fallback answers whatever its confidence)."""
    best = ranked[0]
    out = list(best.placements) + list(best.spares)
    seen = {(p.kind, p.node_id) for p in out}
    for option in ranked[1:]:
        for p in (*option.placements, *option.spares):
            if (p.kind, p.node_id) in seen:
                continue
            seen.add((p.kind, p.node_id))
            out.append(Placement(p.kind, p.node_id, p.tier, p.model, None,
                                 p.est_ms, p.est_cost, p.est_accuracy))
    return tuple(out)


__all__ = ["Estimate", "Option", "TierlinkPolicy", "hard_slice_accuracy", "merge_options",
           "two_choices"]
