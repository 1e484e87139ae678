"""A node's policies and what it checks when a request arrives — the same desk for the live
node and the simulated one: the fleet's policy made with its options, the one a request may
name (where the fleet allows overrides), and the receipt — what the node may hold, whether
any deadline is left."""

from __future__ import annotations

from collections.abc import Callable

from tierlink.core.types import Request, Tier
from tierlink.errors import DeadlineExceeded, InvalidRequest, PrivacyViolation
from tierlink.policy import REGISTRY, Policy, PolicyConfig
from tierlink.routing.mirror import MostCapable
from tierlink.routing.privacy import may_hold
from tierlink.settings.routing import RoutingConfig

__all__ = ["PolicyDesk"]


Count = Callable[[str, str], None]  # (privacy level, verdict) of an input received


def _uncounted(_privacy: str, _verdict: str) -> None:
    pass


class PolicyDesk:
    """What a node (live or simulated) decides when a request arrives, before any plan:
    which policy places it and whether the node may hold it at all. The fleet's policy is
    made at start with its options (``routing.policy: {name, options}``); a policy a request
    names (where the fleet allows it) is made on first use, without options. ``count`` hears
    each receipt's verdict (the live node's metric, the simulator's counters)."""

    def __init__(self, node_id: str, tier: Tier, routing: RoutingConfig,
                 count: Count = _uncounted, config: PolicyConfig | None = None) -> None:
        self.node_id, self.tier = node_id, tier
        self.allow_override = routing.allow_policy_override
        self._count = count
        self.local_features_may_leave = routing.local_features_may_leave
        self._config = config or routing.policy_config()
        self.name = routing.policy
        self.default = REGISTRY.create(routing.policy, self._config, routing.policy_options)
        self._policies: dict[str, Policy] = {routing.policy: self.default}
        # A mirrored answer's request, whatever the fleet's policy (routing/mirror.py)
        self.most_capable = MostCapable(routing.max_hops)

    def made(self) -> tuple[Policy, ...]:
        """Every policy this desk has made so far."""
        return tuple(self._policies.values())

    def named(self, name: str) -> Policy:
        found = self._policies.get(name)
        if found is None:
            if name not in REGISTRY.names():
                raise InvalidRequest(f"unknown policy {name!r}",
                                     hint=f"one of {sorted(REGISTRY.names())}")
            found = self._policies[name] = REGISTRY.create(name, self._config)
        return found

    def for_request(self, req: Request) -> Policy:
        if req.mirror:
            return self.most_capable
        if req.policy is None or req.policy == self.name:
            return self.default
        if not self.allow_override:
            raise InvalidRequest(f"this fleet does not allow choosing the policy per request "
                                 f"(tierlink.policy={req.policy!r})",
                                 hint="set routing.allow_policy_override in the fleet file")
        return self.named(req.policy)

    def receive(self, req: Request, policy: Policy) -> Request:
        """Count what this node actually received; refuse what it may not hold.

        Verdicts: ``allowed``; ``violation`` — the input reached a node that may not hold it
        (refused here). A tierlink node never sends one (its router refuses such plans), so
        a violation means a sender outside the fleet's routing."""
        allowed = may_hold(req.privacy, self.tier, self.node_id, req.origin)
        self._count(req.privacy.value, "allowed" if allowed else "violation")
        if not allowed:
            raise PrivacyViolation(f"{self.node_id} ({self.tier.label}) may not hold "
                                   f"a {req.privacy.value!r} input from {req.origin}")
        if req.deadline_ms <= 0 and policy.respects_deadline:
            raise DeadlineExceeded(f"request {req.request_id} arrived with its deadline spent "
                                   f"({req.deadline_ms:.1f} ms left)")
        return req
