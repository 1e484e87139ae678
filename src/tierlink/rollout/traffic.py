"""Traffic weights: which nodes serve the new version, and for what share. Pure.

A stage is a share of the **tier's traffic**, not of its nodes: with two edge nodes, "10%"
cannot be 10% of the nodes. Each node of the tier gets an :class:`Assignment`
``(node_id, version, weight)``: the node holds ``version`` and serves it for ``weight`` of its
requests for the model, the rest on the previous version. Weight 1.0 is a full move (the new
version becomes the node's active slot); a weight below 1 means the new version sits in the
standby slot and takes that share. Nodes not in the stage get ``(previous, 1.0)``.

Assuming every node of the tier gets the same traffic, the expected share on the new
version is ``sum(weights of new-version assignments) / nodes``. To reach a stage fraction
``f`` over ``n`` nodes the canary set is *concentrated*: ``floor(f * n)`` nodes at weight
1.0 and at most one node at the remainder — 2 nodes at 10% gives one node at 0.2, 3 nodes
one at 0.3, 10 nodes one at 1.0 — so most nodes (and their users) stay untouched.

Nodes are taken in a stable hash order of ``(model, version, node_id)``: deterministic,
independent of the order the fleet lists them in, different for each rollout (edge-1 is not
always the guinea pig), and each stage's canary set contains the previous stage's (the order
is a fixed ranking and stages only grow).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Assignment:
    """What one node should serve: ``version`` for ``weight`` in (0, 1] of its requests for
    the rollout's model, the previous version for the rest."""

    node_id: str
    version: str
    weight: float

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "version": self.version, "weight": self.weight}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Assignment:
        return cls(str(data["node_id"]), str(data["version"]), float(data["weight"]))


def canary_order(model: str, version: str, node_ids: Iterable[str]) -> list[str]:
    """``node_ids`` in the order a rollout of ``model`` ``version`` moves them."""
    def key(node_id: str) -> tuple[str, str]:
        digest = hashlib.sha256(f"{model}\0{version}\0{node_id}".encode()).hexdigest()
        return digest, node_id
    return sorted(set(node_ids), key=key)


def stage_weights(fraction: float, n: int) -> list[float]:
    """New-version weights for the first nodes of the canary order so that their sum is
    ``fraction * n``: whole nodes at 1.0, then at most one partial node."""
    total = fraction * n
    whole = min(n, math.floor(total + _EPS))
    rest = round(total - whole, 12)
    weights = [1.0] * whole
    if rest > _EPS and whole < n:
        weights.append(rest)
    return weights


def assign(model: str, version: str, previous: str, fraction: float,
           node_ids: Iterable[str]) -> tuple[Assignment, ...]:
    """Assignments for every node of the tier at a stage ``fraction``, sorted by node id."""
    order = canary_order(model, version, node_ids)
    weights = stage_weights(fraction, len(order))
    out = [Assignment(node, version, w) for node, w in zip(order, weights, strict=False)]
    out += [Assignment(node, previous, 1.0) for node in order[len(weights):]]
    return tuple(sorted(out, key=lambda a: a.node_id))


def all_on(version: str, node_ids: Iterable[str]) -> tuple[Assignment, ...]:
    """Every node fully on ``version`` (promoted, or rolled back), sorted by node id."""
    return tuple(Assignment(node, version, 1.0) for node in sorted(set(node_ids)))


def expected_share(assignments: Sequence[Assignment], version: str) -> float:
    """Expected share of the tier's traffic served by ``version`` if every node gets the
    same traffic; 0.0 for no nodes."""
    if not assignments:
        return 0.0
    return sum(a.weight for a in assignments if a.version == version) / len(assignments)
