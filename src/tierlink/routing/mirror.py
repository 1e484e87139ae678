"""Mirroring (``routing.mirror``): which answers are asked again, and where. Pure.

A node mirrors a sample of the answers its own models gave — in the background, after the
answer went out — to the most capable model of the task that the request's privacy lets its
input reach, and counts per model version how often the two agree (no label needed: a
version confidently wrong on one class keeps its confidence, and loses agreement). Two
pieces, both used by the live node (``node/mirroring.py``):

* :func:`mirror_odds` — the chance that one answer is mirrored. Every node mirrors at most
  ``share`` of what its models answered; while a canary version stands by at weight ``w``,
  the mirrors are split evenly between it and the active version (``share / 2w`` of the
  canary's answers, ``share / 2(1 - w)`` of the others', each capped at 1), so a canary
  reaches the samples its rollout gate needs as fast as the budget allows, and its baseline
  in the same window as many. The total stays ``share``.
* :class:`MostCapable` — the policy of a mirrored request (``tierlink.mirror``): straight to
  the most accurate model of the task among the nodes the request may reach without
  crossing its privacy (:func:`~tierlink.routing.privacy.may_hold`, the router's own check),
  never a cascade or a split. Each hop plans the same way, so the request walks up to that
  model; the router still admits every plan, as for any request.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from tierlink.core.types import ClusterView, NodeView, Placement, Plan, Request
from tierlink.routing.privacy import may_hold

__all__ = ["MostCapable", "mirror_odds"]


def mirror_odds(share: float, standby_weight: float, on_standby: bool) -> float:
    """The chance an answer is mirrored (see the module doc): ``share`` of a node's answers,
    split evenly between a canary at ``standby_weight`` and the active version."""
    if share <= 0.0:
        return 0.0
    if not 0.0 < standby_weight < 1.0:
        return share
    side = standby_weight if on_standby else 1.0 - standby_weight
    return min(1.0, share / (2.0 * side))


class MostCapable:
    """Places a mirrored request at the most accurate model its privacy allows (see the
    module doc). ``max_hops``: the fleet's forwarding limit."""

    name = "most_capable"
    respects_deadline = True

    def __init__(self, max_hops: int) -> None:
        self.max_hops = max_hops

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan:
        here = view.nodes.get(view.self_id)
        if here is None:
            return Plan((), self.name, reason="this node is not in its own view")
        own = here.model_for(request.task)
        accuracy, ups = self.best_upstreams(request, view)
        if ups and (own is None or accuracy > own.accuracy):
            # every upstream that reaches the best model, the least busy first: the others
            # are the dispatcher's fallbacks (a breaker open on one, a refusal)
            return Plan(tuple(Placement("remote", n.node_id, n.tier, est_accuracy=accuracy)
                              for n in ups),
                        self.name, reason=f"most capable: via {ups[0].node_id}")
        if own is None:
            return Plan((), self.name, reason=f"no model of task {request.task!r} that a "
                        f"{request.privacy.value!r} request may reach")
        return Plan((Placement("local", here.node_id, here.tier, own.name,
                               est_accuracy=own.accuracy),),
                    self.name, reason="most capable: here")

    def best_upstreams(self, request: Request, view: ClusterView
                       ) -> tuple[float, list[NodeView]]:
        """The best accuracy reachable through an upstream of this node, and the upstreams
        that reach it, the least busy first (none when no upstream may take the input)."""
        best, ups = -1.0, list[NodeView]()
        hops_left = self.max_hops - request.hops
        for node in _upstreams(view, view.self_id, request, hops_left):
            accuracy = _reachable(view, node, request, hops_left - 1, {view.self_id})
            if accuracy is None or accuracy < best:
                continue
            if accuracy > best:
                best, ups = accuracy, []
            ups.append(node)
        ups.sort(key=lambda n: (view.outstanding.get(n.node_id, 0), n.node_id))
        return best, ups


def _upstreams(view: ClusterView, node_id: str, request: Request,
               hops_left: int) -> Iterator[NodeView]:
    """The upstreams of ``node_id`` that may hold ``request``'s input."""
    if hops_left <= 0:
        return
    for tier, ids in view.upstream.get(node_id, {}).items():
        for up in ids:
            node = view.nodes.get(up)
            if node is not None and may_hold(request.privacy, tier, up, request.origin):
                yield node


def _reachable(view: ClusterView, node: NodeView, request: Request, hops_left: int,
               seen: set[str]) -> float | None:
    """The best accuracy of a model of the task on ``node`` or beyond it (within
    ``hops_left`` more hops and the request's privacy); None when there is none."""
    own = node.model_for(request.task)
    best = own.accuracy if own is not None else None
    for up in _upstreams(view, node.node_id, request, hops_left):
        if up.node_id in seen:
            continue
        further = _reachable(view, up, request, hops_left - 1, seen | {node.node_id})
        if further is not None and (best is None or further > best):
            best = further
    return best
