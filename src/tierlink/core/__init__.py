"""The pure core: types shared by the live system, the policies and the simulator."""

from tierlink.core.types import (
    CascadePoint,
    ClusterView,
    Fallback,
    LinkView,
    ModelView,
    NodeView,
    Outcome,
    Placement,
    Plan,
    Priority,
    Privacy,
    Request,
    Tier,
)

__all__ = [
    "CascadePoint",
    "ClusterView",
    "Fallback",
    "LinkView",
    "ModelView",
    "NodeView",
    "Outcome",
    "Placement",
    "Plan",
    "Priority",
    "Privacy",
    "Request",
    "Tier",
]
