"""Latency and cost estimates: pure functions over the core types, shared with the simulator."""

from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.estimate.latency import EstimateParams, LinkEstimator, queue_wait_ms, transfer_ms

__all__ = [
    "DEFAULT_COST_MODEL",
    "CostModel",
    "EstimateParams",
    "LinkEstimator",
    "queue_wait_ms",
    "transfer_ms",
]
