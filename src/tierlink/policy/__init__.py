"""Placement policies: pure decisions over a ``ClusterView`` snapshot.

``REGISTRY.create(name, config, options)`` builds one (``options``: the policy's
keyword-only parameters, from ``routing.policy: {name, options}``); a policy that learns
implements ``feedback`` (:class:`Learner`) and hears how each of its plans turned out; built-ins are ``tierlink`` (constraints, then a
weighted score, power-of-two choices inside a tier, cascades), and the benchmark baselines
``cloud_only``, ``device_only``, ``static_rules`` and ``power_of_two``, and ``bandit`` (learned: linear Thompson
sampling among the options ``tierlink``'s constraints leave, taught by each request's
reward). Built-ins and third-party policies alike come in through the ``tierlink.policies``
entry-point group (tierlink's own are declared in its ``pyproject.toml``).
"""

from tierlink.policy.bandit import BanditPolicy
from tierlink.policy.base import (
    REGISTRY,
    Learner,
    Policy,
    PolicyConfig,
    PolicyRegistry,
    RewardWeights,
    Weights,
)
from tierlink.policy.baselines import (
    CloudOnlyPolicy,
    DeviceOnlyPolicy,
    PowerOfTwoPolicy,
    StaticRulesPolicy,
)
from tierlink.policy.placement import TierlinkPolicy

__all__ = [
    "REGISTRY",
    "BanditPolicy",
    "CloudOnlyPolicy",
    "DeviceOnlyPolicy",
    "Learner",
    "Policy",
    "PolicyConfig",
    "PolicyRegistry",
    "PowerOfTwoPolicy",
    "RewardWeights",
    "StaticRulesPolicy",
    "TierlinkPolicy",
    "Weights",
]
