"""A simulation over simulated time, as a person would rather look at it: per run, p95
latency and SLA attainment in windows of simulated time, where the routed run answered
(device / edge / cloud shares), and — when devices have batteries — their mean charge."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.fleet.workload import Record

TIERS = ("device", "edge", "cloud")


def windows(records: Sequence[Record], bins: int) -> tuple[np.ndarray, list[list[Record]]]:
    """``bins`` windows of equal simulated time, by arrival: (their midpoints, records)."""
    end = max((r.item.at_s for r in records), default=0.0) or 1.0
    edges = np.linspace(0.0, end * (1 + 1e-9), bins + 1)
    groups: list[list[Record]] = [[] for _ in range(bins)]
    for r in records:
        groups[min(int(np.searchsorted(edges, r.item.at_s, side="right")) - 1, bins - 1)].append(r)
    return (edges[:-1] + edges[1:]) / 2, groups


def series(records: Sequence[Record], bins: int) -> dict[str, list[float | None]]:
    """Per window: p95 latency of the answered, SLA attainment, tier shares, requests."""
    mids, groups = windows(records, bins)
    out: dict[str, list[float | None]] = {"t_s": [float(m) for m in mids], "p95_ms": [],
                                          "sla": [], "requests": []}
    for tier in TIERS:
        out[tier] = []
    for g in groups:
        answered = [r.latency_ms for r in g if r.answered]
        out["p95_ms"].append(float(np.percentile(answered, 95)) if answered else None)
        out["sla"].append(sum(r.in_sla for r in g) / len(g) if g else None)
        out["requests"].append(float(len(g)))
        for tier in TIERS:
            out[tier].append(sum(r.tier == tier for r in g) / len(g) if g else None)
    return out


def plot(runs: Mapping[str, Sequence[Record]], path: Path, bins: int = 30,
         routed: str = "tierlink",
         batteries: Mapping[str, Sequence[Mapping[str, float]]] | None = None) -> None:
    """``batteries``: per run, its devices' battery timeline (``power.timeline`` of the
    run's report), drawn as a fourth panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 4 if batteries else 3
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3 * panels), sharex=True)
    lat, sla, share = axes[:3]
    for name, records in runs.items():
        s = series(records, bins)
        lat.plot(s["t_s"], _nan(s["p95_ms"]), label=name)
        sla.plot(s["t_s"], _nan(s["sla"]), label=name)
    if routed in runs:
        s = series(runs[routed], bins)
        share.stackplot(s["t_s"], *[_nan(s[t], 0.0) for t in TIERS], labels=TIERS)
    lat.set_ylabel("p95 latency (ms)")
    lat.set_yscale("log")
    sla.set_ylabel("SLA attainment")
    share.set_ylabel(f"{routed}: answered at")
    if batteries:
        battery_panel(axes[3], batteries)
    axes[-1].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def battery_panel(ax: Any, batteries: Mapping[str, Sequence[Mapping[str, float]]],
                  hours: bool = False) -> None:
    """The devices' mean charge over time, a line per run (``power.timeline``); the time
    axis in seconds, or in hours."""
    scale = 3600.0 if hours else 1.0
    for name, timeline in batteries.items():
        ax.plot([p["t_s"] / scale for p in timeline], [p["mean_charge"] for p in timeline],
                label=name, ls="--" if name == "device_only" else "-")
    ax.set_ylabel("devices' mean charge")
    ax.set_ylim(0.0, 1.02)


def _nan(values: Sequence[float | None], fill: float = float("nan")) -> list[float]:
    return [fill if v is None else v for v in values]
