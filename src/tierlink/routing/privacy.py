"""Where an input may be: the one check every route passes (tensor, chat, mirrored)."""

from __future__ import annotations

from tierlink.core.types import Privacy, Tier

__all__ = ["may_hold"]


def may_hold(privacy: Privacy, tier: Tier, node_id: str, origin: str | None) -> bool:
    """Whether ``node_id`` (of ``tier``) may hold an input of ``privacy`` from ``origin``
    (None: its own) — the receipt check of every request, tensor or chat."""
    return privacy.allows(tier, at_origin=origin is None or origin == node_id)
