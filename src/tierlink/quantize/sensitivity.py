"""Per-layer sensitivity and the mixed-precision search — pure functions.

Both work through an injected ``evaluate(excluded_layers) -> accuracy`` (0..1, on the
calibration split): "quantize everything except these layers and measure". The ONNX side
lives in :mod:`tierlink.quantize.variants`; tests pass a fake evaluator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Evaluate = Callable[[tuple[str, ...]], float]


@dataclass(frozen=True, slots=True)
class LayerSensitivity:
    """One layer quantized alone (every other layer FP32): its accuracy on the calibration
    split and the drop from FP32 in points (positive = worse)."""

    layer: str
    op_type: str
    accuracy: float
    drop_pt: float


@dataclass(frozen=True, slots=True)
class MixedPlan:
    """The search's answer. ``kept_fp32``: layers left in FP32, most sensitive first;
    ``accuracy``: calibration accuracy with them kept; ``baseline``: FP32's; ``met``:
    ``baseline - accuracy <= budget_pt``; ``trials``: every (kept, accuracy) evaluated, in
    order, so the report can show the path."""

    kept_fp32: tuple[str, ...]
    accuracy: float
    baseline: float
    budget_pt: float
    met: bool
    trials: tuple[tuple[tuple[str, ...], float], ...]

    @property
    def drop_pt(self) -> float:
        return 100.0 * (self.baseline - self.accuracy)

    def to_dict(self) -> dict[str, Any]:
        return {"kept_fp32": list(self.kept_fp32), "accuracy": self.accuracy,
                "baseline": self.baseline, "budget_pt": self.budget_pt, "met": self.met,
                "trials": [{"kept_fp32": list(k), "accuracy": a} for k, a in self.trials]}


def layer_sensitivity(layers: Sequence[tuple[str, str]], evaluate: Evaluate,
                      baseline: float) -> tuple[LayerSensitivity, ...]:
    """Quantize one layer at a time (exclude all the others); ``layers``: (name, op type)
    in graph order; ``baseline``: the FP32 accuracy. Returned in graph order."""
    names = tuple(name for name, _ in layers)
    result = []
    for name, op in layers:
        acc = evaluate(tuple(n for n in names if n != name))
        result.append(LayerSensitivity(name, op, acc, round(100.0 * (baseline - acc), 4)))
    return tuple(result)


def by_sensitivity(sensitivity: Sequence[LayerSensitivity]) -> tuple[str, ...]:
    """Layer names, most sensitive (largest drop) first; ties keep graph order."""
    order = sorted(enumerate(sensitivity), key=lambda item: (-item[1].drop_pt, item[0]))
    return tuple(s.layer for _, s in order)


def mixed_search(sensitivity: Sequence[LayerSensitivity], evaluate: Evaluate,
                 baseline: float, budget_pt: float) -> MixedPlan:
    """Greedy: quantize everything; while the drop exceeds ``budget_pt`` points, keep the
    next most sensitive layer in FP32 and measure again. Stops at the first set that meets
    the budget, so it keeps as few FP32 layers as the sensitivity order allows; when even
    all layers in FP32 miss it (a noisy evaluator), ``met`` is False."""
    order = by_sensitivity(sensitivity)
    trials: list[tuple[tuple[str, ...], float]] = []
    for count in range(len(order) + 1):
        kept = order[:count]
        acc = evaluate(kept)
        trials.append((kept, acc))
        if 100.0 * (baseline - acc) <= budget_pt + 1e-9:
            return MixedPlan(kept, acc, baseline, budget_pt, True, tuple(trials))
    best_kept, best_acc = max(trials, key=lambda t: t[1])
    return MixedPlan(best_kept, best_acc, baseline, budget_pt, False, tuple(trials))
