"""A small synthetic fleet for simulator tests: three models of a toy task with known
joint answers (no zoo), two devices, an edge, a cloud."""

from __future__ import annotations

import asyncio

from tierlink.core.types import CascadePoint, ClusterView, ModelView, Privacy, Request
from tierlink.fleet.config import FleetConfig, parse_fleet
from tierlink.sim import loop
from tierlink.sim.build import build
from tierlink.sim.outcomes import Outcomes, synthetic_outcomes

N = 2000


def outcomes(seed: int = 1) -> Outcomes:
    """Harder inputs are harder for every model: a shared difficulty drives each model's
    correctness and confidence (so cascades meet a real joint behaviour)."""
    return synthetic_outcomes("toy", {"toy-small": 0.80, "toy-medium": 0.88,
                                      "toy-large": 0.95}, N, seed)


def views() -> dict[str, ModelView]:
    curve = tuple(CascadePoint(t, 0.8, 0.97) for t in (0.5, 0.8, 0.9))
    return {"toy-small": ModelView("toy-small", "toy", "1", 0.80, 0.5, cascade=curve),
            "toy-medium": ModelView("toy-medium", "toy", "1", 0.88, 2.0, cascade=curve),
            "toy-large": ModelView("toy-large", "toy", "1", 0.95, 5.0)}


def fleet(**routing: object) -> FleetConfig:
    return parse_fleet({
        "name": "toy", "seed": 3,
        "routing": {"policy": "tierlink", "allow_policy_override": True,
                    "thresholds": {"toy-small": 0.9, "toy-medium": 0.9}, **routing},
        "nodes": [
            {"id": "cloud-1", "tier": "cloud", "models": ["toy-large"], "workers": 2},
            {"id": "edge-1", "tier": "edge", "models": ["toy-medium"]},
            {"id": "edge-2", "tier": "edge", "models": ["toy-medium"]},
            {"id": "dev-1", "tier": "device", "models": ["toy-small"]},
            {"id": "dev-2", "tier": "device", "models": ["toy-small"]}],
        "links": [
            {"from": ["dev-1", "dev-2"], "to": ["edge-1", "edge-2"], "delay_ms": 5,
             "bandwidth_mbit": 100},
            {"from": ["edge-1", "edge-2"], "to": "cloud-1", "delay_ms": 40,
             "bandwidth_mbit": 50}]})


def device_view() -> ClusterView:
    async def main() -> ClusterView:
        sim, _ = build(fleet(), views(), {"toy": outcomes()},
                       asyncio.get_running_loop().time, 1)
        sim.view_of(sim.nodes["dev-1"])
        return sim.nodes["dev-1"].view

    return loop.run(main)


def request(i: int = 0, privacy: Privacy = Privacy.ANY, deadline: float = 1000.0) -> Request:
    return Request(f"r{i}", "toy", deadline, "dev-1", privacy, input_bytes=3136)
