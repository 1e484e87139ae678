"""A node's policies and what it checks when a request arrives: every registered policy
made once with the fleet's settings, the one a request may name (where the fleet allows
overrides), and the receipt — what the node may hold, whether any deadline is left."""

from __future__ import annotations

from dataclasses import replace

from tierlink.core.types import Request, Tier
from tierlink.errors import DeadlineExceeded, InvalidRequest, PrivacyViolation
from tierlink.node import protocol
from tierlink.policy import REGISTRY, Policy
from tierlink.settings.routing import RoutingConfig
from tierlink.telemetry.metrics import NodeMetrics

__all__ = ["PolicyDesk"]


class PolicyDesk:
    def __init__(self, node_id: str, tier: Tier, routing: RoutingConfig,
                 metrics: NodeMetrics) -> None:
        self._node_id, self._tier = node_id, tier
        self._allow_override = routing.allow_policy_override
        self._metrics = metrics
        self._policies = {name: REGISTRY.create(name, routing.policy_config())
                          for name in REGISTRY.names()}
        self.default = self.named(routing.policy)

    def named(self, name: str) -> Policy:
        if name not in self._policies:
            raise InvalidRequest(f"unknown policy {name!r}", hint=f"one of {sorted(self._policies)}")
        return self._policies[name]

    def for_request(self, req: Request) -> Policy:
        if req.policy is None or req.policy == self.default.name:
            return self.default
        if not self._allow_override:
            raise InvalidRequest(f"this fleet does not allow choosing the policy per request "
                                 f"({protocol.POLICY}={req.policy!r})",
                                 hint="set routing.allow_policy_override in the fleet file")
        return self.named(req.policy)

    def receive(self, req: Request, policy: Policy) -> Request:
        """Count what this node actually received; refuse what it may not hold.

        Verdicts: ``allowed``; ``violation`` — this node is the first to hold the input
        against its privacy level (so summing violations counts *requests*); ``beyond`` —
        an earlier hop already had, and said so in the request."""
        allowed = req.privacy.allows(self._tier, at_origin=req.origin == self._node_id)
        verdict = "allowed" if allowed else ("beyond" if req.privacy_breached else "violation")
        self._metrics.inputs_received.labels(self._tier.label, req.privacy.value, verdict).inc()
        if not allowed and policy.respects_privacy:
            raise PrivacyViolation(f"{self._node_id} ({self._tier.label}) may not hold "
                                   f"a {req.privacy.value!r} input from {req.origin}")
        if req.deadline_ms <= 0 and policy.respects_deadline:
            raise DeadlineExceeded(f"request {req.request_id} arrived with its deadline spent "
                                   f"({req.deadline_ms:.1f} ms left)")
        return req if allowed else replace(req, privacy_breached=True)
