"""Who may send what to this node: its claims bound to the TLS sender (security/claims.py),
peer-only endpoints, refusals counted (``tierlink_peer_refusals_total``).

Only on a node with TLS: without it nobody is authenticated, and the node keeps the open
behaviour (what the client says is what it gets).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tierlink.core.types import Tier
from tierlink.errors import PeerRefused
from tierlink.security.asgi_tls import peer_of
from tierlink.security.claims import Refusal, bind_claims
from tierlink.security.pki import CertIdentity
from tierlink.telemetry.metrics import NodeMetrics


class PeerGuard:
    def __init__(self, node_id: str, tier: Tier, metrics: NodeMetrics, *, enabled: bool,
                 tier_of: Callable[[str], Tier | None]) -> None:
        self.node_id, self.enabled = node_id, enabled
        self._counter = metrics.peer_refusals
        self._tier_label = tier.label
        self._tier_of = tier_of

    def bind(self, scope: Any, params: Mapping[str, Any]) -> dict[str, Any]:
        """A routed request's parameters with its origin bound to the sender of the ASGI
        request ``scope``; raises :class:`PeerRefused` (counted) when the sender may not
        claim them."""
        return self.bind_peer(peer_of(scope) if self.enabled else None, params)

    def bind_peer(self, sender: CertIdentity | None, params: Mapping[str, Any]
                  ) -> dict[str, Any]:
        """:meth:`bind` for a sender already known (a gRPC call's)."""
        if not self.enabled:
            return dict(params)
        bound = bind_claims(self.node_id, sender, params, self._tier_of)
        if isinstance(bound, Refusal):
            raise self.refuse(bound.reason, bound.message)
        return bound

    def require(self, scope: Any, what: str, *, roles: tuple[str, ...] = ("node",)
                ) -> CertIdentity | None:
        """The sender, who must hold a fleet certificate of one of ``roles`` to call
        ``what`` (None on a node without TLS: anyone may)."""
        if not self.enabled:
            return None
        sender = peer_of(scope)
        if sender is None or sender.role not in roles:
            who = "a caller without a fleet certificate" if sender is None else str(sender)
            raise self.refuse("unauthenticated_peer",
                              f"{what} is for {' or '.join(roles)} certificates; {who} "
                              "called it")
        return sender

    def refuse(self, reason: str, message: str) -> PeerRefused:
        self._counter.labels(self._tier_label, reason).inc()
        return PeerRefused(f"{self.node_id}: {message}", reason=reason)
