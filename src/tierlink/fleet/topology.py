"""A fleet file's topology as labels and upstream rules (what node/topology.py acts on).

With ``topology: registry`` (the default) every node takes its upstreams from the registry:
a device the alive edges of its ``site``, an edge the alive clouds of its ``region`` (a
node whose declared links all go to one tier takes that tier instead; one whose links
reach two tiers keeps them as declared). Labels a node does not set are read from the
declared links: the devices and edges joined by links form one site, named after its
first edge (``site-edge-1``); edges and clouds likewise form a region (``region-cloud-1``).
So a file written before labels existed routes as it did, and a node added later with
the same labels is used without restarting anyone.
"""

from __future__ import annotations

from collections.abc import Iterable

from tierlink.core.types import Tier
from tierlink.fleet.config import FleetConfig, NodeConfig

SITE, REGION = "site", "region"


def fleet_labels(cfg: FleetConfig) -> dict[str, dict[str, str]]:
    """Each node's labels: its own, plus ``site`` / ``region`` read from the links."""
    labels = {n.node_id: dict(n.labels) for n in cfg.nodes}
    for key, lower, upper in ((SITE, Tier.DEVICE, Tier.EDGE), (REGION, Tier.EDGE, Tier.CLOUD)):
        pairs = [(l.src, l.dst) for l in cfg.links
                 if cfg.node(l.src).tier is lower and cfg.node(l.dst).tier is upper]
        if key == REGION:  # devices linked straight to a cloud share its region
            pairs += [(l.src, l.dst) for l in cfg.links if cfg.node(l.src).tier is Tier.DEVICE
                      and cfg.node(l.dst).tier is Tier.CLOUD]
        for group in _components(pairs):
            uppers = [n for n in group if cfg.node(n).tier is upper]
            name = f"{key}-{min(uppers or group)}"
            for node_id in group:
                labels[node_id].setdefault(key, name)
    return labels


def upstream_rule(cfg: FleetConfig, node: NodeConfig) -> tuple[str | None, tuple[str, ...]]:
    """``(upstream tier, labels that must match)`` for a node; ``(None, ())``: static."""
    if cfg.topology == "static":
        return None, ()
    tiers = {cfg.node(l.dst).tier for l in cfg.links_from(node.node_id)}
    if len(tiers) > 1:
        return None, ()
    if tiers:
        tier = tiers.pop()
    elif node.tier is Tier.DEVICE:
        tier = Tier.EDGE if any(n.tier is Tier.EDGE for n in cfg.nodes) else Tier.CLOUD
    elif node.tier is Tier.EDGE:
        tier = Tier.CLOUD
    else:
        return None, ()
    return tier.label, ((SITE,) if tier is Tier.EDGE else (REGION,))


def _components(pairs: Iterable[tuple[str, str]]) -> list[set[str]]:
    """The connected groups of nodes the pairs join."""
    parent: dict[str, str] = {}

    def root(n: str) -> str:
        parent.setdefault(n, n)
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a, b in pairs:
        parent[root(a)] = root(b)
    out: dict[str, set[str]] = {}
    for n in list(parent):
        out.setdefault(root(n), set()).add(n)
    return list(out.values())
