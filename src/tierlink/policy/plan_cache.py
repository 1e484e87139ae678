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

A cache that finds nothing costs its keys. The first decision on a snapshot cannot find
anything (the cache starts empty with each snapshot), so it is made without one — a
simulated device that plans once per snapshot never keys at all; and where keys do not come
back (a node whose requests are all forwarded with budgets of their own), fewer than
:data:`WORTH` of its last :data:`PROBE` lookups found, it stands aside for :data:`REST`
decisions and then tries again.

One thing a snapshot does not fix is a split's tail queue, read live from the node's own
in-flight counts: the key carries that count for each split pick. The prices are the
snapshot's (``ClusterView.day_s``, the hour it was taken): a new price window comes with a
new snapshot, so the cache never serves a plan priced at another hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tierlink.core.types import NodeView, Plan, Request, Tier

__all__ = ["CachedPlan", "Draw", "PlanCache", "key"]

LIMIT = 4096  # entries per snapshot; a snapshot with more keys starts over
PROBE, WORTH, REST = 512, 0.02, 8192  # lookups judged at once, the share found, decisions off


class Draw(NamedTuple):
    """The power-of-two draws toward one upstream tier (a NamedTuple: one per tier per
    decision, on the request path)."""

    tier: Tier
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
    aside: int = 0  # decisions made while the cache stood aside (it was not paying)
    _view: object = None
    _entries: dict[tuple[object, ...], CachedPlan] = field(default_factory=dict)
    _window: tuple[int, int] = (0, 0)  # hits and lookups since the last judgement
    _rest: int = 0

    def active(self, view: object) -> bool:
        """Whether this decision (over ``view``) looks in the cache: not the first on a
        snapshot (nothing to find: the cache starts over with it), nor one while it stands
        aside."""
        if not self.enabled:
            return False
        if view is not self._view:
            self._view, self._entries = view, {}
            return False
        if self._rest > 0:
            self._rest -= 1
            self.aside += 1
            return False
        return True

    def get(self, k: tuple[object, ...]) -> CachedPlan | None:
        """The entry under ``k`` for the snapshot :meth:`active` was last asked about."""
        found = self._entries.get(k)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        hits, lookups = self._window
        hits, lookups = hits + (found is not None), lookups + 1
        if lookups >= PROBE:
            if hits < WORTH * lookups:
                self._rest, self._entries = REST, {}
            hits = lookups = 0
        self._window = (hits, lookups)
        return found

    def put(self, k: tuple[object, ...], entry: CachedPlan) -> None:
        if len(self._entries) >= LIMIT:
            self._entries.clear()
        self._entries[k] = entry

