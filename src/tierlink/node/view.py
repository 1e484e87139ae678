"""Turn what a node knows — the registry's last view, its own live state, its link estimates
and its circuit breakers — into the ``ClusterView`` snapshot its policy decides over."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tierlink.core.types import CascadePoint, ClusterView, LinkView, ModelView, NodeView, Tier


def model_view_from_dict(d: Mapping[str, Any]) -> ModelView:
    return ModelView(
        name=str(d["name"]), task=str(d["task"]), version=str(d["version"]),
        accuracy=float(d.get("accuracy", 0.0)), latency_ms=float(d.get("latency_ms", 1.0)),
        output_bytes=int(d.get("output_bytes", 64)),
        cascade=tuple(CascadePoint(float(p["threshold"]), float(p["answered_share"]),
                                   float(p["answered_accuracy"])) for p in d.get("cascade", [])),
    )


def model_view_to_dict(m: ModelView) -> dict[str, Any]:
    return {"name": m.name, "task": m.task, "version": m.version, "accuracy": m.accuracy,
            "latency_ms": round(m.latency_ms, 4), "output_bytes": m.output_bytes,
            "cascade": [{"threshold": p.threshold, "answered_share": p.answered_share,
                         "answered_accuracy": p.answered_accuracy} for p in m.cascade]}


def node_view_from_record(rec: Mapping[str, Any], healthy: bool) -> NodeView:
    """A registry record (a heartbeat body plus ``age_s``) as a policy sees it."""
    return NodeView(
        node_id=str(rec["node_id"]), tier=Tier.parse(str(rec["tier"])),
        models=tuple(model_view_from_dict(m) for m in rec.get("models", [])),
        queue_depth=int(rec.get("queue_depth", 0)), inflight=int(rec.get("inflight", 0)),
        workers=int(rec.get("workers", 1)), healthy=healthy, age_s=float(rec.get("age_s", 0.0)),
    )


def links_from_record(rec: Mapping[str, Any]) -> list[LinkView]:
    src = str(rec["node_id"])
    return [LinkView(src, str(l["dst"]), float(l.get("rtt_ms", 1.0)),
                     float(l.get("bandwidth_mbit", 1000.0)), float(l.get("loss", 0.0)))
            for l in rec.get("links", [])]


def build_view(
    me: NodeView,
    records: Iterable[Mapping[str, Any]],
    my_links: Iterable[LinkView],
    healthy: Callable[[str], bool],
    outstanding: dict[str, int],
) -> ClusterView:
    """Registry records for everyone else, live state for ``me``; my own links come from my
    estimators (fresher than what the registry echoes back)."""
    nodes = [me]
    links = list(my_links)
    for rec in records:
        if rec.get("node_id") == me.node_id:
            continue
        try:
            nodes.append(node_view_from_record(rec, healthy(str(rec["node_id"]))))
            links.extend(links_from_record(rec))
        except (KeyError, ValueError, TypeError):
            continue  # one malformed record must not blind the router to the rest
    return ClusterView.build(me.node_id, nodes, links, outstanding)
