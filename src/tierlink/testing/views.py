"""Build realistic ``ClusterView`` snapshots without a fleet: a device, edges and clouds
holding the Fashion-MNIST variants with figures close to the real zoo's cards."""

from __future__ import annotations

from tierlink.core.types import (
    CascadePoint,
    ClusterView,
    DeviceState,
    LinkView,
    ModelView,
    NodeView,
    Tier,
)

# (share answered, accuracy on those) at thresholds 0.5..0.99, shaped like the real cards.
_SMALL_CURVE = ((0.5, 0.99, 0.915), (0.8, 0.90, 0.96), (0.9, 0.84, 0.975), (0.99, 0.62, 0.995))
_MEDIUM_CURVE = ((0.5, 0.99, 0.93), (0.8, 0.93, 0.965), (0.9, 0.88, 0.98), (0.99, 0.70, 0.996))


def model(variant: str, accuracy: float, latency_ms: float, version: str = "1",
          task: str = "fmnist") -> ModelView:
    curve = {"small": _SMALL_CURVE, "medium": _MEDIUM_CURVE}.get(variant, ())
    points = tuple(CascadePoint(t, s, a) for t, s, a in curve)
    return ModelView(f"{task}-{variant}", task, version, accuracy, latency_ms, cascade=points)


SMALL = model("small", 0.910, 0.3)
MEDIUM = model("medium", 0.925, 0.8)
LARGE = model("large", 0.936, 2.5)


def fleet_view(
    *,
    edges: int = 2,
    clouds: int = 1,
    self_id: str = "dev-1",
    device_edge_rtt_ms: float = 10.0,
    edge_cloud_rtt_ms: float = 80.0,
    edge_queues: dict[str, int] | None = None,
    unhealthy: frozenset[str] = frozenset(),
    device_state: DeviceState | None = None,
) -> ClusterView:
    """One device (``dev-1``, reporting ``device_state``) linked to every edge, every edge
    linked to every cloud. ``self_id`` selects whose point of view the snapshot is."""
    queues = edge_queues or {}
    nodes = [NodeView("dev-1", Tier.DEVICE, (SMALL,), state=device_state)]
    links: list[LinkView] = []
    for i in range(1, edges + 1):
        eid = f"edge-{i}"
        nodes.append(NodeView(eid, Tier.EDGE, (MEDIUM,), queue_depth=queues.get(eid, 0),
                              healthy=eid not in unhealthy))
        links.append(LinkView("dev-1", eid, device_edge_rtt_ms, 100.0))
        for j in range(1, clouds + 1):
            links.append(LinkView(eid, f"cloud-{j}", edge_cloud_rtt_ms, 50.0))
    for j in range(1, clouds + 1):
        cid = f"cloud-{j}"
        nodes.append(NodeView(cid, Tier.CLOUD, (LARGE,), workers=2, healthy=cid not in unhealthy))
    return ClusterView.build(self_id, nodes, links)
