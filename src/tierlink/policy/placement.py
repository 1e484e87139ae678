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

A request pinned to a model version (``Request.version``) is a constraint too: a model
counts only if it serves that version (``ModelView.holds``: its active version or a canary
on standby), and it goes upstream only to nodes that serve it or can pass it on to one that
does within the hops left (:func:`toward_version`); it is never answered by another version.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

from tierlink.core.types import (
    ClusterView,
    CodecPoint,
    ModelView,
    NodeView,
    Placement,
    Plan,
    Request,
    SplitPoint,
    Tier,
)
from tierlink.estimate.latency import queue_wait_ms, transfer_ms
from tierlink.estimate.split import SegmentProfile, SplitEstimate
from tierlink.estimate.split import candidates as split_candidates
from tierlink.policy.base import PolicyConfig
from tierlink.policy.plan_cache import CachedPlan, Draw, PlanCache, key


class Estimate(NamedTuple):
    """Expected figures of one option; ``worst_ms`` assumes every cascade stage escalates.
    (A NamedTuple: thousands are built per second on the request path.)"""

    latency_ms: float
    worst_ms: float
    cost: float
    accuracy: float


class Choice(NamedTuple):
    """One option at one node, before it is turned into placements.

    ``kind`` is "local", "remote" or "cascade"; ``pick``/``spare`` are the power-of-two
    winner and runner-up for remote and cascade options."""

    kind: str
    est: Estimate
    node: NodeView
    model: ModelView | None = None
    pick: NodeView | None = None
    spare: NodeView | None = None
    threshold: float | None = None
    up_worst_ms: float = 0.0  # the upstream part's worst case (for the dispatcher's check)
    cut: str = ""  # a split choice: the head runs here up to ``cut``, the tail on ``pick``
    codec: str = ""
    split_model: str = ""

    @property
    def label(self) -> str:
        return self.kind if self.pick is None else f"{self.kind}:{_TIER_LABELS[self.pick.tier]}"


_TIER_LABELS = {t: t.label for t in Tier}


def hard_slice_accuracy(upstream_accuracy: float, escalated_share: float) -> float:
    """Accuracy an upstream model reaches on the inputs a cascade escalates to it.

    Those inputs are the hard ones, so its overall accuracy is optimistic. The pessimistic
    bound puts all of its errors inside the escalated slice; this takes the midpoint of the
    two. Only a fallback: a fleet tuned with `cascade tune` prices cascades from measured
    joint records instead (``PolicyConfig.cascade_records``).
    """
    if escalated_share <= 0:
        return upstream_accuracy
    pessimistic = max(0.0, 1.0 - (1.0 - upstream_accuracy) / escalated_share)
    return 0.5 * (upstream_accuracy + pessimistic)


class Eligibility:
    """Which feasible options may come first (the rest are fallbacks only): those within
    ``accuracy_tolerance`` points of the most accurate one and, where a cascade was tuned
    for these models, the cascades among them. The share of inputs each path of models
    escalated (from the calibration records) is remembered here."""

    def __init__(self, config: PolicyConfig) -> None:
        self._cfg = config
        self._path_shares: dict[tuple[str, ...], float] = {}  # config-derived, kept

    def of(self, feasible: list[Choice], path: tuple[str, ...] = ()) -> list[Choice]:
        """The options of ``feasible`` that may come first, for an input the models of
        ``path`` escalated (``()``: as it arrives)."""
        return self._tuned_first(self._accurate_enough(feasible, path))

    def _accurate_enough(self, feasible: list[Choice], path: tuple[str, ...]) -> list[Choice]:
        """The options within ``accuracy_tolerance`` points of the most accurate one: the
        tuned cascade's target says what is accurate enough, and among those latency and
        cost decide (0: every option competes on the whole weighted score). The tolerance
        is about a request's accuracy overall: on the inputs ``path`` escalated (a share of
        them) a point lost there costs only that share of a point overall, so it widens by
        that share."""
        tolerance = self._cfg.accuracy_tolerance / 100.0
        if tolerance <= 0:
            return feasible
        tolerance /= self._share(path)
        best = max(c.est.accuracy for c in feasible)
        return [c for c in feasible if c.est.accuracy >= best - tolerance - 1e-12]

    def _tuned_first(self, eligible: list[Choice]) -> list[Choice]:
        """With an accuracy tolerance and calibration records (a cascade tuned for these
        models), a cascade that is accurate enough and fits the deadline is run: the tuning
        already chose how much to escalate, and its target holds only if every node of the
        chain follows it. The weights choose among what is left when none fits (answer
        here, or send up at once)."""
        if self._cfg.accuracy_tolerance <= 0 or not self._cfg.cascade_records:
            return eligible
        cascades = [c for c in eligible if c.kind == "cascade"]
        return cascades or eligible

    def _share(self, path: tuple[str, ...]) -> float:
        """The share of inputs that the models of ``path`` all escalated (calibration
        records; 1 for the empty path or when unrecorded)."""
        if not path:
            return 1.0
        share = self._path_shares.get(path)
        if share is None:
            share = next((rec.share for key, rec in self._cfg.cascade_records.items()
                          if key[:-1] == path), 1.0)
            self._path_shares[path] = share = max(share, 1e-3)
        return share


class TierlinkPolicy:
    """The default policy (registered as ``"tierlink"``)."""

    name = "tierlink"
    respects_deadline = True

    def __init__(self, config: PolicyConfig) -> None:
        self._cfg = config
        # Memo of upstream valuations for the current view only (see _best): a pure
        # function's cache, dropped whenever a new snapshot arrives.
        self._memo_view: ClusterView | None = None
        self._memo: dict[tuple[object, ...], Estimate | None] = {}
        self._memo_plans: dict[tuple[object, ...], list[SplitEstimate]] = {}
        self._memo_ref: dict[tuple[str, int], float] = {}
        self._priced = config.cost  # the prices at the current view's time of day
        self._eligible = Eligibility(config)  # which options may come first
        # A decision's request-independent half per snapshot (policy/plan_cache.py); the
        # plan itself too while the order is this class's ranking.
        self.cache = PlanCache()
        cls = type(self)
        self._own_order = (cls.order is TierlinkPolicy.order
                           and cls.plan_from is TierlinkPolicy.plan_from)

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan:
        draws = self._draw(view.self_id, request, view, request.hops, rng)
        if not self.cache.active(view):
            feasible, why = self._options(request, view, rng, draws)
            if not feasible:
                return Plan((), self.name, reason=why)
            return self.plan_from(request, view, self.order(request, view, feasible, rng))
        entry = self._cached(request, view, rng, draws)
        if not entry.feasible:
            return Plan((), self.name, reason=entry.why)
        if not self._own_order:
            feasible = _with_spares(entry.feasible, draws)
            return self.plan_from(request, view, self.order(request, view, feasible, rng))
        spares = tuple(d.spare.node_id if d.spare else None for d in draws)
        plan = entry.plans.get(spares)
        if plan is None:
            if entry.ranked is None:
                entry.ranked = self.ranked(request, view, entry.feasible)
            plan = self.plan_from(request, view, _with_spares(entry.ranked, draws))
            entry.plans[spares] = plan
        return plan

    def plan_from(self, request: Request, view: ClusterView, order: list[Choice]) -> Plan:
        """The plan that puts ``order``'s first option first (the rest as fallbacks); its
        reason says when the node's battery or heat sent the request away."""
        reason = self._cfg.device_state.reason(order[0].label, view.me.state,
                                               not _computes_here(order[0]))
        return Plan(merge_placements(order), self.name, reason=reason)

    def order(self, request: Request, view: ClusterView, feasible: list[Choice],
              rng: random.Random) -> list[Choice]:
        """This policy's order of the feasible options, first = what it would do (a shadow
        candidate is asked the same over the same options)."""
        return self.ranked(request, view, feasible)

    def feasible_choices(self, request: Request, view: ClusterView, rng: random.Random
                         ) -> tuple[list[Choice], str]:
        """The options the hard constraints leave (privacy, models, health, the deadline's
        worst case); when none, why not."""
        draws = self._draw(view.self_id, request, view, request.hops, rng)
        if not self.cache.active(view):
            return self._options(request, view, rng, draws)
        entry = self._cached(request, view, rng, draws)
        return _with_spares(entry.feasible, draws), entry.why

    def _cached(self, request: Request, view: ClusterView, rng: random.Random,
                draws: tuple[Draw, ...]) -> CachedPlan:
        """What this request's draws give (the options without spares), from the plan cache
        when this snapshot already saw the same request fields and picks."""
        k = key(request, draws)
        entry = self.cache.get(k)
        if entry is None:
            bare = tuple(d if d.spare is None else d._replace(spare=None) for d in draws)
            entry = CachedPlan(*self._options(request, view, rng, bare))
            self.cache.put(k, entry)
        return entry

    def _options(self, request: Request, view: ClusterView, rng: random.Random,
                 draws: tuple[Draw, ...]) -> tuple[list[Choice], str]:
        """The options ``draws`` give that fit the deadline's worst case; when none, why."""
        self._use_view(view)
        budget = request.deadline_ms - self._cfg.reserve_ms
        choices = self._choices(view.self_id, request, view, budget, request.hops, rng, (),
                                draws)
        # Answering here needs no reserve beyond the deadline itself; leaving does.
        feasible = [c for c in choices if c.est.worst_ms <= (
            request.deadline_ms if c.kind == "local" else budget)]
        return feasible, "" if feasible else self._why_none(request, view, choices)

    def ranked(self, request: Request, view: ClusterView, feasible: list[Choice]
               ) -> list[Choice]:
        """``feasible`` best first by the weighted score; what the tolerance or the tuned
        cascade set aside comes last, as fallbacks only."""
        ref_cost = self.reference_cost(request, view)
        eligible = self._eligible.of(feasible)
        ranked = sorted(eligible, key=lambda c: -self._score(c.est, request.deadline_ms,
                                                             ref_cost))
        ordered = ranked + [c for c in feasible if c not in ranked]  # fallbacks, never first
        # A low battery or a hot device: what an upstream can answer in time goes first.
        return self._cfg.device_state.spared_first(view.me.state, ordered, _computes_here)

    def reference_cost(self, req: Request, view: ClusterView) -> float:
        """The cost term's unit: answering ``req`` at the dearest node of the fleet that
        serves its task (compute there plus moving the input into its tier). Fixed per
        view and input size, so an option's cost term does not depend on which other
        options happen to fit the deadline: ``weights.cost = 2`` means sending every
        request to the dearest tier is worth two points of accuracy."""
        self._use_view(view)
        key = (req.task, req.input_bytes)
        ref = self._memo_ref.get(key)
        if ref is None:
            sent = req.input_bytes + self._cfg.estimates.request_overhead_bytes
            ref = max((self._priced.compute(n.tier, m.latency_ms)
                       + self._priced.transfer(n.tier, sent)
                       for n in view.nodes.values()
                       if (m := n.model_for(req.task)) is not None), default=0.0)
            self._memo_ref[key] = ref
        return ref

    # -- options -----------------------------------------------------------------------

    def _draw(self, node_id: str, req: Request, view: ClusterView, hops: int,
              rng: random.Random) -> tuple[Draw, ...]:
        """The power-of-two draws of a decision at ``node_id`` (``hops`` from the request's
        entry), per upstream tier in a fixed order: a split's tail node (this node's own
        decisions, when it holds heads), then the remote option's pick and spare (where
        privacy lets the input go)."""
        if hops >= self._cfg.max_hops:
            return ()
        node = view.nodes[node_id]
        draws = []
        for tier, ids in view.upstream.get(node_id, {}).items():
            if req.version is not None:
                ids = toward_version(ids, view, req.task, req.version,
                                     self._cfg.max_hops - hops - 1)
                if not ids:
                    continue
            split, waiting = None, 0
            if node.heads and node_id == view.self_id:
                split = two_choices(ids, view, req.task, rng)[0]
                waiting = view.outstanding.get(split.node_id, 0) if split else 0
            pick = spare = None
            if req.privacy.allows(tier, at_origin=False):
                pick, spare = two_choices(ids, view, req.task, rng)
            draws.append(Draw(tier, split, pick, spare, waiting))
        return tuple(draws)

    def _choices(
        self, node_id: str, req: Request, view: ClusterView, budget: float, hops: int,
        rng: random.Random, path: tuple[str, ...], draws: tuple[Draw, ...] | None = None,
    ) -> list[Choice]:
        """The options at ``node_id`` for an input that the models of ``path`` escalated
        on its way there (``()``: an input as it arrives, unfiltered), given the decision's
        ``draws`` (drawn here when None: an upstream valued on the way)."""
        node = view.nodes[node_id]
        local = self._local(node, req, view, path)
        choices = [local] if local else []
        if hops >= self._cfg.max_hops:
            return choices
        if draws is None:
            draws = self._draw(node_id, req, view, hops, rng)
        for d in draws:
            if d.split is not None:
                split = self._split(node, d.split, req, view)
                if split:
                    choices.append(split)
            if d.pick is None:
                continue
            remote = self._remote(node, d.pick, d.spare, req, view, budget, hops, rng, path)
            if remote is None:
                continue
            choices.append(remote)
            cascade = (self._cascade(local, remote, req, view, budget, hops, rng, path)
                       if local else None)
            if cascade:
                choices.append(cascade)
        return choices

    def _split(self, node: NodeView, up: NodeView | None, req: Request,
               view: ClusterView) -> Choice | None:
        """Run a model's head here and its tail on ``up`` (the power-of-two pick), at the
        (cut, codec) that scores best over the live link: the fastest, unless a slightly
        slower codec loses less accuracy than its extra latency is worth (the weights)."""
        if up is None or not self._features_may_go(req, up.tier):
            return None
        model = up.model_for(req.task, req.version)
        plans = self._split_plans_memo(node, up, model, view) if model else []
        if model is None or not plans:
            return None
        w, deadline = self._cfg.weights, max(req.deadline_ms, 1e-9)
        best = max(plans, key=lambda p: -w.accuracy * p.accuracy_loss
                   - w.latency * p.total_ms / deadline)
        tail_ms = best.tail_ms - queue_wait_ms(up, model, view.outstanding.get(up.node_id, 0)) \
            - self._cfg.estimates.hop_overhead_ms
        # Only the inputs no early exit answered cross the link and run the tail.
        share = best.continue_share
        cost = (self._priced.compute(node.tier, best.head_ms)
                + share * (self._priced.transfer(up.tier, best.wire_bytes)
                           + self._priced.compute(up.tier, tail_ms)))
        est = Estimate(best.total_ms, best.total_ms, cost,
                       max(0.0, model.accuracy - best.accuracy_loss / 100.0))
        return Choice("split", est, node, None, up, None, None, best.total_ms - best.head_ms,
                      best.cut, best.codec, model.name)

    def _use_view(self, view: ClusterView) -> None:
        """Drop the memos when a new snapshot arrives (they hold for one view only)."""
        if view is not self._memo_view:
            self._memo_view, self._memo, self._memo_plans = view, {}, {}
            self._memo_ref = {}
            self._priced = self._cfg.cost.at(view.day_s)

    def _split_plans_memo(self, node: NodeView, up: NodeView, model: ModelView,
                          view: ClusterView) -> list[SplitEstimate]:
        """``split_plans`` cached for the current view (pricing every cut x codec is the
        dearest part of a plan: ~0.2 ms, ten times that on a 0.1-core device)."""
        self._use_view(view)
        key = (node.node_id, up.node_id, model.name, model.version)
        if key not in self._memo_plans:
            self._memo_plans[key] = split_plans(node, up, model, view, self._cfg)
        return self._memo_plans[key]

    def _features_may_go(self, req: Request, tier: Tier) -> bool:
        return req.privacy.features_allowed(
            tier, local_may_leave=self._cfg.local_features_may_leave)

    def _local(self, node: NodeView, req: Request, view: ClusterView,
               path: tuple[str, ...]) -> Choice | None:
        model = node.model_for(req.task, req.version)
        if model is None or not req.privacy.allows(node.tier, at_origin=node.node_id == req.origin):
            return None
        outstanding = 0 if node.node_id == view.self_id else view.outstanding.get(node.node_id, 0)
        latency = queue_wait_ms(node, model, outstanding) + model.latency_ms
        est = Estimate(latency, latency, self._priced.compute(node.tier, model.latency_ms),
                       self._accuracy(model, path))
        return Choice("local", est, node, model)

    def _accuracy(self, model: ModelView, path: tuple[str, ...]) -> float:
        """``model``'s accuracy on the inputs that reach it along ``path``: the calibration
        record when the thresholds were tuned with it, else its overall accuracy."""
        if not self._cfg.cascade_records:
            return model.accuracy
        rec = self._cfg.record((*path, model.name))
        return rec.accuracy if rec is not None and rec.share > 0 else model.accuracy

    def _remote(
        self, node: NodeView, pick: NodeView, spare: NodeView | None, req: Request,
        view: ClusterView, budget: float, hops: int, rng: random.Random,
        path: tuple[str, ...],
    ) -> Choice | None:
        est = self._remote_estimate(node, pick, req, view, budget, hops, rng, path)
        return None if est is None else Choice("remote", est, node, None, pick, spare, None,
                                               est.worst_ms)

    def _remote_estimate(
        self, node: NodeView, up: NodeView, req: Request, view: ClusterView, budget: float,
        hops: int, rng: random.Random, path: tuple[str, ...],
    ) -> Estimate | None:
        link = view.links.get((node.node_id, up.node_id))
        if link is None:
            return None
        params = self._cfg.estimates
        sent = req.input_bytes + params.request_overhead_bytes
        hop_ms = transfer_ms(sent + params.response_bytes, link) + params.hop_overhead_ms
        sub = self._best_memo(up.node_id, req, view, budget - hop_ms, hops + 1, rng, path)
        if sub is None:
            return None
        return Estimate(hop_ms + sub.latency_ms, hop_ms + sub.worst_ms,
                        self._priced.transfer(up.tier, sent) + sub.cost, sub.accuracy)

    def _best_memo(
        self, node_id: str, req: Request, view: ClusterView, budget: float, hops: int,
        rng: random.Random, path: tuple[str, ...],
    ) -> Estimate | None:
        """``_best`` cached per snapshot. The budget is rounded *down* to a 10% grid, so a
        cached valuation never claims an option fits a budget it does not fit."""
        if budget <= 0:
            return None
        self._use_view(view)
        grid = _BUDGET_GRID ** math.floor(math.log(budget, _BUDGET_GRID))
        key = (node_id, req.task, req.version, req.privacy, req.origin, req.input_bytes, hops,
               grid, path)
        if key not in self._memo:
            if len(self._memo) > _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = self._best(node_id, req, view, grid, hops, rng, path)
        return self._memo[key]

    def _best(
        self, node_id: str, req: Request, view: ClusterView, budget: float, hops: int,
        rng: random.Random, path: tuple[str, ...],
    ) -> Estimate | None:
        """What ``node_id``'s policy would do with the request: its best feasible option."""
        feasible = [c for c in self._choices(node_id, req, view, budget, hops, rng, path)
                    if c.est.worst_ms <= budget]
        if not feasible:
            return None
        if len(feasible) == 1:
            return feasible[0].est
        ref_cost = self.reference_cost(req, view)
        return max(self._eligible.of(feasible, path),
                   key=lambda c: self._score(c.est, budget, ref_cost)).est

    def _cascade(self, local: Choice, remote: Choice, req: Request, view: ClusterView,
                 budget: float, hops: int, rng: random.Random,
                 path: tuple[str, ...]) -> Choice | None:
        """Answer here, escalate to ``remote``'s pick below the threshold. Priced from the
        calibration records when the thresholds were tuned with them: the share answered
        here and its accuracy at exactly the threshold in force, and the upstream valued on
        the inputs this model escalates (the hard ones: what its policy does with those,
        at the accuracies measured on them). Without records: the model card's cascade
        curve and :func:`hard_slice_accuracy`."""
        model = local.model
        if model is None:
            return None
        threshold = self._cfg.threshold_for(model.name)
        lo = local.est
        rec = self._cfg.record((*path, model.name)) if self._cfg.cascade_records else None
        up: Estimate | None
        if rec is not None and rec.answered is not None and remote.pick is not None:
            answered, answered_accuracy = rec.answered, rec.answered_accuracy or 0.0
            up = self._remote_estimate(local.node, remote.pick, req, view, budget, hops, rng,
                                       (*path, model.name))
            if up is None:
                return None
            hard_accuracy = up.accuracy
        else:
            point = model.cascade_at(threshold)
            if point is None:
                return None
            answered, answered_accuracy = point.answered_share, point.answered_accuracy
            up = remote.est
            hard_accuracy = hard_slice_accuracy(up.accuracy, 1.0 - answered)
        escalated = 1.0 - answered
        est = Estimate(
            lo.latency_ms + escalated * up.latency_ms,
            lo.latency_ms + up.worst_ms,
            lo.cost + escalated * up.cost,
            answered * answered_accuracy + escalated * hard_accuracy,
        )
        return Choice("cascade", est, local.node, model, remote.pick, remote.spare, threshold,
                      up.worst_ms)

    # -- scoring -----------------------------------------------------------------------

    def _score(self, est: Estimate, deadline_ms: float, ref_cost: float) -> float:
        """The weighted score. With an accuracy tolerance the options compared are already
        accurate enough (:class:`Eligibility`): only latency and cost decide."""
        w = self._cfg.weights
        latency_term = est.latency_ms / deadline_ms if deadline_ms > 0 else 1.0
        cost_term = est.cost / ref_cost if ref_cost > 0 else 0.0
        accuracy_term = 0.0 if self._cfg.accuracy_tolerance > 0 else 100.0 * est.accuracy
        return w.accuracy * accuracy_term - w.latency * latency_term - w.cost * cost_term

    def _why_none(self, req: Request, view: ClusterView, choices: list[Choice]) -> str:
        if not choices:
            return (f"no node reachable from {view.self_id} holds a model for task "
                    f"{req.task!r}{_version(req)} that privacy {req.privacy.value!r} allows")
        fastest = min(choices, key=lambda c: c.est.worst_ms)
        via = fastest.pick.node_id if fastest.pick else fastest.node.node_id
        return (f"deadline {req.deadline_ms:.1f} ms cannot be met: the fastest option "
                f"({fastest.label} via {via}) needs {fastest.est.worst_ms:.1f} ms")


_BUDGET_GRID = 1.1
_MEMO_LIMIT = 4096


def _version(req: Request) -> str:
    return f" version {req.version!r}" if req.version else ""


def toward_version(ids: tuple[str, ...], view: ClusterView, task: str, version: str,
                   hops_left: int) -> tuple[str, ...]:
    """For a request pinned to ``version``: the nodes among ``ids`` that serve it for
    ``task``, or can pass it on to one that does in at most ``hops_left`` more hops."""
    return tuple(i for i in ids if _reaches(view, i, task, version, hops_left))


def _reaches(view: ClusterView, node_id: str, task: str, version: str, hops_left: int) -> bool:
    if view.nodes[node_id].model_for(task, version) is not None:
        return True
    if hops_left <= 0:
        return False
    return any(_reaches(view, up, task, version, hops_left - 1)
               for ids in view.upstream.get(node_id, {}).values() for up in ids)


def _computes_here(choice: Choice) -> bool:
    """Does the option run a model on the deciding node (alone, as a cascade's first stage
    or a split's head)?"""
    return choice.kind != "remote"


def two_choices(
    ids: tuple[str, ...], view: ClusterView, task: str, rng: random.Random
) -> tuple[NodeView | None, NodeView | None]:
    """Power of two choices among healthy nodes of one tier: (shorter wait, the other).
    A tie is broken at random, so idle equal nodes share the load (and a canary on either
    one sees its share of the traffic) instead of the first listed taking all of it."""
    if len(ids) > 2:
        # Two distinct indices without random.sample's generic machinery (hot path).
        n = len(ids)
        i = int(rng.random() * n)
        j = int(rng.random() * (n - 1))
        j += j >= i
        healthy = [view.nodes[ids[k]] for k in (i, j) if view.nodes[ids[k]].healthy]
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
    wait_a, wait_b = _wait(a, view, task), _wait(b, view, task)
    if wait_b < wait_a or (wait_b == wait_a and rng.random() < 0.5):
        a, b = b, a
    return a, b


def _wait(node: NodeView, view: ClusterView, task: str) -> float:
    model = node.model_for(task)
    outstanding = view.outstanding.get(node.node_id, 0)
    if model is None:
        return float(node.queue_depth + outstanding)
    return queue_wait_ms(node, model, outstanding)


def _with_spares(choices: list[Choice], draws: tuple[Draw, ...]) -> list[Choice]:
    """``choices`` (made without spares) with each upstream option's spare as drawn."""
    spares = {d.tier: d.spare for d in draws if d.spare is not None}
    if not spares:
        return list(choices)
    return [c._replace(spare=spares.get(c.pick.tier))
            if c.pick is not None and c.kind != "split" else c for c in choices]


def placements(choice: Choice) -> tuple[Placement, ...]:
    """A choice as the placements the dispatcher runs: the primary ones, then the spare."""
    est = choice.est
    out: list[Placement] = []
    if choice.model is not None:
        node = choice.node
        out.append(Placement("local", node.node_id, node.tier, choice.model.name,
                             choice.threshold, est.latency_ms, est.cost, est.accuracy))
    if choice.cut and choice.pick is not None:  # a split plan: head here, tail upstream
        out.append(Placement("remote", choice.pick.node_id, choice.pick.tier,
                             choice.split_model, None, choice.up_worst_ms,
                             est.cost, est.accuracy, cut=choice.cut, codec=choice.codec))
    elif choice.pick is not None:  # est_ms: the worst case of the upstream part alone
        out.append(Placement("remote", choice.pick.node_id, choice.pick.tier, None, None,
                             choice.up_worst_ms, est.cost, est.accuracy))
    if choice.spare is not None:
        out.append(Placement("remote", choice.spare.node_id, choice.spare.tier))
    return tuple(out)


def merge_placements(ranked: list[Choice]) -> tuple[Placement, ...]:
    """The best choice's placements, then every other choice's nodes not yet in the plan as
    plain fallbacks (a local fallback answers whatever its confidence)."""
    out = list(placements(ranked[0]))
    seen = {(p.kind, p.node_id) for p in out}
    for choice in ranked[1:]:
        node = choice.node
        if choice.model is not None and ("local", node.node_id) not in seen:
            seen.add(("local", node.node_id))
            out.append(Placement("local", node.node_id, node.tier, choice.model.name))
        for up in (choice.pick, choice.spare):
            if up is not None and ("remote", up.node_id) not in seen:
                seen.add(("remote", up.node_id))
                out.append(Placement("remote", up.node_id, up.tier))
    return tuple(out)


def split_plans(node: NodeView, up: NodeView, model: ModelView, view: ClusterView,
                cfg: PolicyConfig) -> list[SplitEstimate]:
    """Every admissible (cut, codec) plan for ``model``'s head on ``node`` and its tail on
    ``up``, fastest first (empty when ``node`` holds no profiled head of it or no link to
    ``up`` is known)."""
    head = next((h for h in node.heads if h.name == model.name), None)
    link = view.links.get((node.node_id, up.node_id))
    if head is None or link is None or not model.splits:
        return []
    segments = _segments(head.splits, model.splits)
    # the tail's queue, and the hop's fixed overhead (the link estimate leaves it out)
    queue = (queue_wait_ms(up, model, view.outstanding.get(up.node_id, 0))
             + cfg.estimates.hop_overhead_ms)
    return split_candidates(segments, cfg.split_codecs, link, queue,
                            cfg.split_max_accuracy_loss) if segments else []


def _segments(heads: tuple[SplitPoint, ...],
              tails: tuple[SplitPoint, ...]) -> tuple[SegmentProfile, ...]:
    """The segments of the cuts profiled on both sides, made once per pair of profiles: a
    node's views reuse the same profile tuples until they change, and a device prices
    every cut x codec for every request."""
    key = (id(heads), id(tails))
    hit = _SEGMENTS.get(key)
    if hit is not None and hit[0] is heads and hit[1] is tails:
        return hit[2]
    by_cut = {p.cut: p for p in tails}
    made = tuple(SegmentProfile(p.cut, p.head_ms, by_cut[p.cut].tail_ms, p.feature_bytes,
                                _codecs_across(p, by_cut[p.cut]), p.continue_share)
                 for p in heads if p.cut in by_cut)
    if len(_SEGMENTS) >= _SEGMENTS_LIMIT:
        _SEGMENTS.clear()
    _SEGMENTS[key] = (heads, tails, made)  # the tuples kept alive: their ids stay theirs
    return made


_SEGMENTS: dict[tuple[int, int], tuple[tuple[SplitPoint, ...], tuple[SplitPoint, ...],
                                       tuple[SegmentProfile, ...]]] = {}
_SEGMENTS_LIMIT = 64


def _codecs_across(head: SplitPoint, tail: SplitPoint) -> tuple[CodecPoint, ...]:
    """The codecs measured at a cut, encoded on the head's node and decoded on the tail's
    (each side's own profile; the head's decode time where the tail has none)."""
    decode = {c.codec: c.decode_ms for c in tail.codecs}
    return tuple(CodecPoint(c.codec, c.wire_bytes, c.encode_ms, decode.get(c.codec, c.decode_ms))
                 for c in head.codecs)


__all__ = ["Choice", "Estimate", "TierlinkPolicy", "hard_slice_accuracy", "merge_placements",
           "placements", "split_plans", "two_choices"]

