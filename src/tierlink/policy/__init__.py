"""Placement policies: pure decisions over a ``ClusterView`` snapshot.

``REGISTRY.create(name, config)`` builds one; built-ins are ``tierlink`` (constraints, then a
weighted score, power-of-two choices inside a tier, cascades), and the benchmark baselines
``cloud_only``, ``device_only`` and ``static_rules``, and ``bandit`` (learned: linear Thompson
sampling among the options ``tierlink``'s constraints leave, taught by each request's reward). Third-party policies register through the
``tierlink.policies`` entry-point group.
"""

from tierlink.policy.bandit import BanditPolicy
from tierlink.policy.base import (
    REGISTRY,
    Policy,
    PolicyConfig,
    PolicyRegistry,
    RewardWeights,
    Weights,
)
from tierlink.policy.baselines import CloudOnlyPolicy, DeviceOnlyPolicy, StaticRulesPolicy
from tierlink.policy.placement import TierlinkPolicy

REGISTRY.register("tierlink", TierlinkPolicy)
REGISTRY.register("cloud_only", CloudOnlyPolicy)
REGISTRY.register("device_only", DeviceOnlyPolicy)
REGISTRY.register("static_rules", StaticRulesPolicy)
REGISTRY.register("bandit", BanditPolicy)

__all__ = [
    "REGISTRY",
    "BanditPolicy",
    "CloudOnlyPolicy",
    "DeviceOnlyPolicy",
    "Policy",
    "PolicyConfig",
    "PolicyRegistry",
    "RewardWeights",
    "StaticRulesPolicy",
    "TierlinkPolicy",
    "Weights",
]
