"""Baseline policies for benchmarks.

``cloud_only`` and ``device_only`` ignore deadlines by definition, so a report can show what
sending everything to one tier costs; ``cloud_only`` ignores privacy too, and the node's router
refuses each of its plans that would move an input further than its privacy allows (privacy
is the router's to enforce, whatever the policy: a report counts those refusals). ``static_rules``
is what a team without a router would deploy: each request to the most capable tier its
privacy level allows (``local`` on the device, ``site`` on the edge, ``any`` in the cloud),
whatever its deadline or difficulty. ``power_of_two`` is a plain load balancer over the
feasible set ``tierlink`` computes (benchmarks/hot_spots.py measures against it)."""

from __future__ import annotations

import random
from collections.abc import Callable

from tierlink.core.types import ClusterView, Placement, Plan, Request, Tier
from tierlink.policy.base import PolicyConfig
from tierlink.policy.placement import Choice, TierlinkPolicy, toward_version, two_choices


class CloudOnlyPolicy:
    """Forward toward the highest tier reachable; serve locally only at the top."""

    name = "cloud_only"
    respects_deadline = False

    def __init__(self, config: PolicyConfig) -> None:
        self._cfg = config

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan:
        tiers = view.upstream.get(view.self_id, {})
        plan = _forward(self.name, sorted(tiers, reverse=True), request, view, self._cfg, rng,
                        lambda _tier: "forward to the top tier")
        return plan or _local_or_refuse(self.name, request, view)


class StaticRulesPolicy:
    """Each request to the most capable tier its privacy level lets hold it: forward to the
    highest allowed upstream tier, answer here once no allowed tier lies above. Privacy is
    respected (the rule is built from it); deadlines are not (a static rule has no notion
    of them: a late answer is still an answer)."""

    name = "static_rules"
    respects_deadline = False

    def __init__(self, config: PolicyConfig) -> None:
        self._cfg = config

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan:
        allowed = [t for t in view.upstream.get(view.self_id, {}) if t > view.me.tier
                   and request.privacy.allows(t, at_origin=False)]
        plan = _forward(self.name, sorted(allowed, reverse=True), request, view, self._cfg,
                        rng, lambda tier: f"privacy {request.privacy.value}: {tier.label}")
        return plan or _local_or_refuse(self.name, request, view)


class DeviceOnlyPolicy:
    """Answer on the node that received the request, never forward."""

    name = "device_only"
    respects_deadline = False

    def __init__(self, config: PolicyConfig) -> None:
        self._cfg = config

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan:
        return _local_or_refuse(self.name, request, view)


class PowerOfTwoPolicy(TierlinkPolicy):
    """The plain load balancer a request router is measured against: over the same
    feasible set as ``tierlink`` (privacy, models, health, the deadline's worst case), two
    options drawn at random, the one expected to answer sooner first, the rest as
    fallbacks — no accuracy, cost or cascade in the choice."""

    name = "power_of_two"

    def order(self, request: Request, view: ClusterView, feasible: list[Choice],
              rng: random.Random) -> list[Choice]:
        if len(feasible) < 2:
            return list(feasible)
        i = int(rng.random() * len(feasible))
        j = int(rng.random() * (len(feasible) - 1))
        j += j >= i
        pair = sorted((feasible[i], feasible[j]), key=lambda c: c.est.latency_ms)
        return pair + [c for k, c in enumerate(feasible) if k not in (i, j)]


def _forward(name: str, tiers: list[Tier], request: Request, view: ClusterView,
             config: PolicyConfig, rng: random.Random,
             reason: Callable[[Tier], str]) -> Plan | None:
    """Forward to the first of ``tiers`` with a healthy node (and a spare of it); None when
    none has one. A pinned version is never traded off."""
    upstream = view.upstream.get(view.self_id, {})
    for tier in tiers:
        ids = upstream[tier]
        if request.version is not None:
            ids = toward_version(ids, view, request.task, request.version,
                                 config.max_hops - request.hops - 1)
        pick, spare = two_choices(ids, view, request.task, rng)
        if pick is not None:
            chosen = [pick] + ([spare] if spare else [])
            return Plan(tuple(Placement("remote", n.node_id, n.tier) for n in chosen), name,
                        reason(tier), respects_deadline=False)
    return None


def _local_or_refuse(name: str, request: Request, view: ClusterView) -> Plan:
    me = view.me
    model = me.model_for(request.task, request.version)
    if model is None:
        return Plan((), name, f"{me.node_id} holds no model for task {request.task!r}",
                    respects_deadline=False)
    return Plan((Placement("local", me.node_id, me.tier, model.name),), name, "local",
                respects_deadline=False)
