"""Placement policies: pure decisions over a ``ClusterView`` snapshot.

``REGISTRY.create(name, config)`` builds one; built-ins are ``tierlink`` (constraints, then a
weighted score, power-of-two choices inside a tier, cascades), and the benchmark baselines
``cloud_only``, ``device_only`` and ``static_rules``. Third-party policies register through the
``tierlink.policies`` entry-point group.
"""

from tierlink.policy.base import REGISTRY, Policy, PolicyConfig, PolicyRegistry, Weights
from tierlink.policy.baselines import CloudOnlyPolicy, DeviceOnlyPolicy, StaticRulesPolicy
from tierlink.policy.placement import TierlinkPolicy

REGISTRY.register("tierlink", TierlinkPolicy)
REGISTRY.register("cloud_only", CloudOnlyPolicy)
REGISTRY.register("device_only", DeviceOnlyPolicy)
REGISTRY.register("static_rules", StaticRulesPolicy)

__all__ = [
    "REGISTRY",
    "CloudOnlyPolicy",
    "DeviceOnlyPolicy",
    "Policy",
    "PolicyConfig",
    "PolicyRegistry",
    "StaticRulesPolicy",
    "TierlinkPolicy",
    "Weights",
]
