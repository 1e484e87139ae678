"""Turn what a node knows — the registry's last view, its own live state, its link estimates
and its circuit breakers — into the ``ClusterView`` snapshot its policy decides over."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tierlink import __version__
from tierlink.core.types import ClusterView, LinkView, ModelView, NodeView
from tierlink.errors import ModelNotFound

if TYPE_CHECKING:
    from tierlink.node.models import ModelManager
    from tierlink.node.version_stats import VersionStatsBook


def model_view_to_dict(m: ModelView) -> dict[str, Any]:
    return {"name": m.name, "task": m.task, "version": m.version, "accuracy": m.accuracy,
            "latency_ms": round(m.latency_ms, 4), "output_bytes": m.output_bytes,
            "cascade": [{"threshold": p.threshold, "answered_share": p.answered_share,
                         "answered_accuracy": p.answered_accuracy} for p in m.cascade],
            "splits": [p.to_dict() for p in m.splits]}


class ParsedRecords:
    """The registry's records as core views, parsed once per fetched list: the registry
    cache replaces its list on each fetch (about once a second) while the view is rebuilt
    four times as often, and a node with a split profile is a hundred-odd points to parse."""

    def __init__(self) -> None:
        self._source: object | None = None
        self._parsed: list[tuple[NodeView, list[LinkView]]] = []

    def views(self, records: Iterable[Mapping[str, Any]]) -> list[tuple[NodeView, list[LinkView]]]:
        if records is not self._source:
            self._parsed = _parse(records)
            self._source = records
        return self._parsed


def _parse(records: Iterable[Mapping[str, Any]]) -> list[tuple[NodeView, list[LinkView]]]:
    from tierlink.control.client import node_views

    parsed = []
    for rec in records:
        try:
            (node,), node_links = node_views([dict(rec)])
        except (KeyError, ValueError, TypeError):
            continue  # one malformed record must not blind the router to the rest
        parsed.append((node, node_links))
    return parsed


def build_view(
    me: NodeView,
    records: Iterable[Mapping[str, Any]],
    my_links: Iterable[LinkView],
    healthy: Callable[[str], bool],
    outstanding: dict[str, int],
    parsed: ParsedRecords | None = None,
    day_s: float = 0.0,
) -> ClusterView:
    """Registry records for everyone else, live state for ``me``; my own links come from my
    estimators (fresher than what the registry echoes back). ``parsed``: where the records'
    parsed views are kept between calls on the same list (None: parsed now)."""
    nodes = [me]
    links = list(my_links)
    for node, node_links in (parsed.views(records) if parsed is not None else _parse(records)):
        if node.node_id == me.node_id:
            continue
        nodes.append(replace(node, healthy=healthy(node.node_id)))
        links.extend(node_links)
    return ClusterView.build(me.node_id, nodes, links, outstanding, day_s)


def heartbeat(me: NodeView, address: str, models: ModelManager, stats: VersionStatsBook,
              links: Iterable[LinkView], started_at: float,
              labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A node's state for the control plane: one ``models`` entry per version served
    (``role`` active / standby, its ``weight``, its ``stats``), the versions it could not
    install (``install_failures``), its links as it measures them."""
    links = list(links)
    return {
        "node_id": me.node_id, "tier": me.tier.label, "address": address,
        "models": _model_entries(me, models, stats),
        "language_models": [lm.to_dict() for lm in me.language_models],
        "install_failures": models.failures(),
        "queue_depth": me.queue_depth, "inflight": me.inflight,  # compute, not routing
        "workers": me.workers, "upstream": sorted(link.dst for link in links),
        "links": [{"dst": l.dst, "rtt_ms": round(l.rtt_ms, 3),
                   "bandwidth_mbit": l.bandwidth_mbit, "loss": l.loss} for l in links],
        "started_at": started_at, "software": __version__, "labels": dict(labels or {}),
        "device_state": me.state.to_dict() if me.state else None,
    }


def _model_entries(me: NodeView, models: ModelManager, stats: VersionStatsBook
                   ) -> list[dict[str, Any]]:
    views = {m.name: m for m in me.models}
    entries = []
    for served in models.served():
        info = served.runtime.info  # views and stats go by the card's name
        view = views.get(info.name) if served.role == "active" else None
        entry = model_view_to_dict(view or info.view())
        entry.update(role=served.role, weight=round(served.weight, 6),
                     stats=stats.get(info.name, info.version))
        entries.append(entry)
    return entries


def check_version_known(view: ClusterView, task: str, version: str | None) -> None:
    """A request pinned to a version that no node in ``view`` serves for ``task`` is the
    caller's mistake (404), not a fleet short of capacity (503): refused where it arrives."""
    if version is None:
        return
    held = {v for node in view.nodes.values() for m in node.models if m.task == task
            for v in (m.versions or (m.version,))}
    if version not in held:
        raise ModelNotFound(f"no node serves task {task!r} at version {version!r}",
                            hint=f"versions served now: {sorted(held)}; omit "
                                 "tierlink.version to take whichever answers")
