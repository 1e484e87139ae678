"""What ``tierlink quantize`` shows: one row per variant, the sensitivity table, its PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tierlink.errors import QuantizationError
from tierlink.models.card import ModelCard
from tierlink.quantize.variants import card_verdict


def variant_row(card: ModelCard, parent: ModelCard, budget_pt: float) -> dict[str, Any]:
    """A variant's card against its parent's, as JSON-ready numbers and its verdict."""
    lineage = card.lineage
    if lineage is None:
        raise QuantizationError(f"{card.name} is not a derived variant")
    return {"name": card.name, "parent": parent.name, "precision": card.precision,
            "size_bytes": card.size_bytes, "size_ratio": card.size_bytes / parent.size_bytes,
            "test_accuracy": card.test_accuracy, "parent_test_accuracy": parent.test_accuracy,
            "accuracy_delta_pt": 100.0 * lineage.accuracy_delta,
            "agreement": lineage.agreement, "latency_ms": dict(card.latency_ms),
            "speedup": dict(lineage.speedup), "temperature": card.temperature,
            "fp32_layers": list(lineage.settings.get("fp32_layers", [])),
            "quantized_layers": list(lineage.settings.get("quantized_layers", [])),
            "verdict": card_verdict(card, parent, budget_pt)}


def variants_table(rows: list[dict[str, Any]], budget_pt: float) -> Any:
    from rich.table import Table

    table = Table(title=f"quantized variants vs FP32 parent (test split; speedup side by "
                        f"side, 1 thread; budget {budget_pt:g} pt)")
    for col in ("variant", "KB", "size", "accuracy", "Δ pt", "agree", "b1 ms", "b1 x",
                "b32 x", "verdict"):
        table.add_column(col, justify="left" if col in ("variant", "verdict") else "right")
    for r in rows:
        table.add_row(r["name"], f"{r['size_bytes'] / 1024:.0f}", f"{r['size_ratio']:.2f}",
                      f"{100 * r['test_accuracy']:.2f}%", f"{r['accuracy_delta_pt']:+.2f}",
                      f"{100 * r['agreement']:.1f}%", f"{r['latency_ms']['batch1_p50']:.3f}",
                      f"{r['speedup']['batch1']:.2f}", f"{r['speedup']['batch32']:.2f}",
                      r["verdict"])
    return table


def sensitivity_rows(card: ModelCard) -> list[dict[str, Any]]:
    """Per layer of a ``mixed`` card: its accuracy drop quantized alone (calibration split,
    points) and whether the search kept it in FP32."""
    settings = card.lineage.settings if card.lineage else {}
    if "sensitivity" not in settings:
        raise QuantizationError(f"{card.name} has no sensitivity scan (only mixed variants)")
    kept = set(settings["search"]["kept_fp32"])
    return [{"layer": layer, "drop_pt": float(drop), "kept_fp32": layer in kept}
            for layer, drop in settings["sensitivity"].items()]


def sensitivity_table(card: ModelCard) -> Any:
    from rich.table import Table

    search = card.lineage.settings["search"] if card.lineage else {}
    table = Table(title=f"{card.lineage.parent if card.lineage else card.name}: per-layer "
                        f"sensitivity (INT8 alone, calibration split); mixed drop "
                        f"{100 * (search['baseline'] - search['accuracy']):.2f} pt, budget "
                        f"{search['budget_pt']:g} pt, {'met' if search['met'] else 'NOT met'}")
    for col in ("layer", "drop pt", "precision in -mixed"):
        table.add_column(col, justify="right" if col == "drop pt" else "left")
    for r in sensitivity_rows(card):
        table.add_row(r["layer"], f"{r['drop_pt']:+.2f}", "FP32" if r["kept_fp32"] else "INT8")
    return table


def plot_sensitivity(card: ModelCard, path: Path) -> Path:
    """A bar per layer (accuracy drop when only it is INT8), FP32-kept layers marked, the
    budget as a line. Matplotlib, Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sensitivity_rows(card)
    budget = card.lineage.settings["search"]["budget_pt"] if card.lineage else 0.0
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(rows) + 2), 3.6))
    colors = ["tab:red" if r["kept_fp32"] else "tab:blue" for r in rows]
    ax.bar([r["layer"] for r in rows], [r["drop_pt"] for r in rows], color=colors)
    ax.axhline(budget, color="gray", linestyle="--", linewidth=1, label=f"budget {budget:g} pt")
    ax.set_ylabel("accuracy drop (points)")
    ax.set_title(f"{card.lineage.parent if card.lineage else card.name}: INT8 sensitivity per "
                 f"layer (red: kept FP32)")
    ax.tick_params(axis="x", rotation=45)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
