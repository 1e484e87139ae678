"""The plan cache: what a plan does not owe to the request in hand, kept per snapshot.

A plan is not a function of the view alone: the power-of-two choices are drawn from the
node's generator for every request, and the remaining deadline, the input's size, its
privacy and its hops decide what fits. So a decision is made in two halves
(``TierlinkPolicy.feasible_choices``): first the draws — per upstream tier, in a fixed
order, the nodes the power of two picks (and the one a split's tail would run on) — then
the options those draws give, with their estimates and the deadline's worst-case check.
The second half is a pure function of the snapshot, the request's routing fields and the
picks, so it is kept here under exactly those (:func:`key`) for as long as the snapshot
holds — the options without their spares (a spare is only a fallback node: no estimate or
rank depends on it; each request's are put back), their ranking when the order is the
tierlink policy's own, and the plans made from it per set of spares. With the cache on or
off a node makes the same decisions (tested on a fixed-seed simulation).

One thing a snapshot does not fix is a split's tail queue, read live from the node's own
in-flight counts: the key carries that count for each split pick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tierlink.core.types import NodeView, Plan, Request, Tier

__all__ = ["CachedPlan", "Draw", "PlanCache", "key"]

LIMIT = 4096  # entries per snapshot; a snapshot with more keys starts over


class Draw(NamedTuple):
    """The power-of-two draws toward one upstream tier (a NamedTuple: one per tier per
    decision, on the request path)."""

    tier: Tier
    ids: tuple[str, ...]  # the tier's nodes (toward a pinned version)
    split: NodeView | None = None  # the node a split's tail would run on (None: no split)
    pick: NodeView | None = None  # the remote option's node (None: not drawn)
    spare: NodeView | None = None
    split_outstanding: int = 0  # the node's in-flight count to ``split`` (live)


@dataclass(slots=True)
class CachedPlan:
    """A decision's request-independent half: the feasible options without spares (or why
    none) and, when the order is the tierlink policy's ranking, that order and the plans
    made from it by spares."""

    feasible: list[Any]
    why: str
    ranked: list[Any] | None = None
    plans: dict[tuple[str | None, ...], Plan] = field(default_factory=dict)


def key(req: Request, draws: tuple[Draw, ...]) -> tuple[object, ...]:
    """Everything the second half of a decision reads from the request and the draws (a
    spare is not read: see the module)."""
    picks = tuple((d.tier, d.split.node_id if d.split else None, d.split_outstanding,
                   d.pick.node_id if d.pick else None) for d in draws)
    return (req.task, req.version, req.privacy, req.origin, req.input_bytes, req.hops,
            req.deadline_ms, picks)


@dataclass(slots=True)
class PlanCache:
    """Decisions' second halves for one snapshot, and how often one was found."""

    enabled: bool = True
    hits: int = 0
    misses: int = 0
    _view: object = None
    _entries: dict[tuple[object, ...], CachedPlan] = field(default_factory=dict)

    def get(self, view: object, k: tuple[object, ...]) -> CachedPlan | None:
        if not self.enabled:
            return None
        if view is not self._view:
            self._view, self._entries = view, {}
        found = self._entries.get(k)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, k: tuple[object, ...], entry: CachedPlan) -> None:
        if not self.enabled:
            return
        if len(self._entries) >= LIMIT:
            self._entries.clear()
        self._entries[k] = entry

    @property
    def hit_rate(self) -> float | None:
        total = self.hits + self.misses
        return self.hits / total if total else None
