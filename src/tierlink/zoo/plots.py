"""PNG figures of zoo models (matplotlib, imported only when a figure is drawn)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.models.calibration import reliability


def reliability_png(curves: Mapping[str, tuple[np.ndarray, np.ndarray, float]], path: Path,
                    title: str = "reliability on the test split") -> Path:
    """One reliability diagram per model, before and after temperature scaling.

    ``curves``: model name -> (logits (N, C), labels (N,), temperature). Each panel plots
    the accuracy of every confidence bin against its mean confidence (the diagonal is
    perfect calibration) and names the ECE before and after."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 4), squeeze=False)
    for ax, (name, (logits, labels, t)) in zip(axes[0], curves.items(), strict=True):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
        for temp, style, label in ((1.0, "o--", "raw"), (t, "s-", f"T = {t:.2f}")):
            rel = reliability(logits, labels, temp)
            used = rel.counts > 0
            ax.plot(rel.confidence[used], rel.accuracy[used], style, ms=4,
                    label=f"{label}: ECE {100 * rel.ece:.2f}%")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
