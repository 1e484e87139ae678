"""Fleets of thousands from a template: a fleet file's own nodes and links, replicated.

Each tier's first node in the file is its template (models, workers, CPU quota); each
generated device links to ``edges_per_device`` edges (spread evenly), every edge to
``clouds_per_edge`` clouds, with the delay, jitter, bandwidth and loss of the file's first
link of that kind. Routing, cost model and seed are the file's.
"""

from __future__ import annotations

from dataclasses import replace

from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.fleet.config import FleetConfig, LinkConfig, NodeConfig


def generate(base: FleetConfig, devices: int, edges: int, clouds: int,
             edges_per_device: int = 2, clouds_per_edge: int = 1) -> FleetConfig:
    templates = {tier: next((n for n in base.nodes if n.tier is tier), None) for tier in Tier}
    missing = [t.label for t, n in templates.items() if n is None]
    if missing:
        raise ConfigError(f"fleet {base.name!r} has no {', '.join(missing)} node to copy")
    if min(devices, edges, clouds) < 1:
        raise ConfigError("a generated fleet needs at least one node of each tier")
    links = {(_tier(base, l.src), _tier(base, l.dst)): l for l in reversed(base.links)}
    for pair in ((Tier.DEVICE, Tier.EDGE), (Tier.EDGE, Tier.CLOUD)):
        if pair not in links:
            raise ConfigError(f"fleet {base.name!r} has no {pair[0].label} -> "
                              f"{pair[1].label} link to copy")
    nodes = (_copies(templates[Tier.CLOUD], "cloud", clouds)
             + _copies(templates[Tier.EDGE], "edge", edges)
             + _copies(templates[Tier.DEVICE], "dev", devices))
    wired: list[LinkConfig] = []
    for i in range(devices):
        for j in range(min(edges_per_device, edges)):
            wired.append(replace(links[Tier.DEVICE, Tier.EDGE], src=f"dev-{i + 1}",
                                 dst=f"edge-{(i * edges_per_device + j) % edges + 1}"))
    for e in range(edges):
        for j in range(min(clouds_per_edge, clouds)):
            wired.append(replace(links[Tier.EDGE, Tier.CLOUD], src=f"edge-{e + 1}",
                                 dst=f"cloud-{(e + j) % clouds + 1}"))
    return replace(base, name=f"{base.name}-x{devices}", nodes=tuple(nodes),
                   links=tuple(wired))


def _copies(template: NodeConfig | None, prefix: str, n: int) -> list[NodeConfig]:
    assert template is not None
    return [replace(template, node_id=f"{prefix}-{i + 1}", heads=()) for i in range(n)]


def _tier(config: FleetConfig, node_id: str) -> Tier:
    return config.node(node_id).tier
