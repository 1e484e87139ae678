"""What a node's spans say about a request, its plan and its answer (attribute names:
``tierlink.*``, beside OpenTelemetry's own where one fits)."""

from __future__ import annotations

from typing import Any

from tierlink.core.types import Outcome, Placement, Plan, Request, Tier


def route_attributes(node_id: str, tier: Tier, req: Request) -> dict[str, Any]:
    return {"tierlink.node": node_id, "tierlink.tier": tier.label, "tierlink.task": req.task,
            "tierlink.request_id": req.request_id, "tierlink.priority": req.priority.label,
            "tierlink.privacy": req.privacy.value, "tierlink.deadline_ms": req.deadline_ms,
            "tierlink.hops": req.hops, "tierlink.origin": req.origin}


def plan_attributes(plan: Plan) -> dict[str, Any]:
    """The plan as one readable string (``dev-1:local<0.70 > edge-1:remote``) and why."""
    return {"tierlink.policy": plan.policy, "tierlink.reason": plan.reason,
            "tierlink.plan": " > ".join(_placement(p) for p in plan.placements)}


def _placement(p: Placement) -> str:
    text = f"{p.node_id}:{p.kind}"
    if p.cut:
        text += f"[{p.cut}/{p.codec}]"
    if p.escalate_below is not None:
        text += f"<{p.escalate_below:.2f}"
    return text


def outcome_attributes(outcome: Outcome) -> dict[str, Any]:
    return {"tierlink.served_by": outcome.served_by, "tierlink.model": outcome.model,
            "tierlink.confidence": outcome.confidence,
            "tierlink.escalations": outcome.escalations,
            "tierlink.fallbacks": len(outcome.fallbacks), "tierlink.path": list(outcome.path),
            "tierlink.degraded": outcome.degraded or None, "tierlink.split": outcome.split
            or None}
