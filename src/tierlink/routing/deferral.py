"""When work that may wait should run: the seeds' peak/valley advice as a mechanism.

A request answered asynchronously whose deadline reaches past a change of prices
(``cost.schedule``) may wait for a cheaper window. :func:`deferral` asks the request's
policy what it would plan at the start of each window the deadline allows — the same
snapshot, priced at that hour (``ClusterView.day_s``), the deadline shortened by the wait —
and picks the window where that plan's estimated cost is lowest; now, on a tie. The start
is spread over the chosen window (by the request's id: the same request, the same start),
so a window's deferred work does not all arrive at its first second, and it always leaves
``margin_s`` before the deadline: a deferred request is never late for its wait.

Pure: no clock, no I/O; the live node (``node/deferred.py``) and the simulator
(``sim/fleet.py``) both call it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from tierlink.core.types import ClusterView, Request
from tierlink.estimate.cost import DAY_S, CostModel
from tierlink.policy.base import Policy

DEFER_MARGIN_S = 300.0  # a deferred request starts at least this long before its deadline


@dataclass(frozen=True, slots=True)
class Deferral:
    """When to run: ``wait_s`` from now (0: now); the plan's estimated cost then and now."""

    wait_s: float
    est_cost: float
    now_cost: float

    @property
    def deferred(self) -> bool:
        return self.wait_s > 0


def windows(cost: CostModel, day_s: float, latest_s: float) -> list[tuple[float, float]]:
    """The stretches ``[start, end)`` of seconds from now, within ``[0, latest_s]``, in
    which every price holds (split at each change of the schedule)."""
    changes = cost.changes()
    starts = [0.0]
    for day in range(int(latest_s // DAY_S) + 2):
        for at in changes:
            offset = day * DAY_S + at - day_s
            if 0.0 < offset < latest_s:
                starts.append(offset)
    starts = sorted(set(starts))
    return list(zip(starts, [*starts[1:], latest_s], strict=True))


def deferral(policy: Policy, req: Request, view: ClusterView, cost: CostModel,
             *, margin_s: float = DEFER_MARGIN_S) -> Deferral:
    """When ``req`` (asynchronous) should run, by what its policy would plan at each window
    its deadline allows (see the module)."""
    latest_s = req.deadline_ms / 1000.0 - margin_s
    if not cost.schedule or latest_s <= 0:  # nothing to wait for: no plan is priced
        return Deferral(0.0, 0.0, 0.0)
    now = _cost_at(policy, req, view, 0.0)
    if now is None:
        return Deferral(0.0, 0.0, 0.0)
    best_start, best_end, best = 0.0, 0.0, now
    for start, end in windows(cost, view.day_s, latest_s)[1:]:
        then = _cost_at(policy, req, view, start)
        if then is not None and then < best * (1.0 - 1e-9):
            best_start, best_end, best = start, end, then
    if best_start == 0.0:
        return Deferral(0.0, now, now)
    spread = random.Random(f"{req.request_id}:spread").random()
    return Deferral(best_start + spread * (best_end - best_start), best, now)


def _cost_at(policy: Policy, req: Request, view: ClusterView, wait_s: float) -> float | None:
    """The estimated cost of what ``policy`` would plan for ``req`` run ``wait_s`` from now
    (the same snapshot, priced then); None when it would plan nothing."""
    later = replace(req, deadline_ms=req.deadline_ms - wait_s * 1000.0)
    priced = replace(view, day_s=(view.day_s + wait_s) % DAY_S)
    plan = policy.plan(later, priced, random.Random(req.request_id))
    return plan.placements[0].est_cost if plan.placements else None
