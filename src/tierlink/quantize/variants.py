"""Quantized variants of a model: make one, measure it against its parent, register it.

A variant is ``<parent>-<suffix>.onnx`` with its card ``<parent>-<suffix>.json`` beside
the parent (``fmnist-small-int8``; :func:`make_variant_at`). The card is written last and
atomically, so a family that lists its directory (the zoo: :mod:`tierlink.zoo.variants`)
sees the variant exactly when both files agree; a rebuilt parent makes it stale (its
``lineage.parent_sha256`` no longer matches) and the family makes it again.

Everything a card claims is measured here: accuracy and top-1 agreement with the parent on
the test split, temperature and cascade curve on the calibration split, and latency timed
side by side with the parent in one run (:mod:`tierlink.quantize.timing`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from tierlink.errors import ModelNotFound, QuantizationError
from tierlink.models.card import CPU, Lineage, ModelCard, file_sha256, save_card
from tierlink.models.layout import CARD_FILE, MODEL_FILE, Layout
from tierlink.quantize.methods import QuantResult, model_layers, quantize_model
from tierlink.quantize.sensitivity import (
    LayerSensitivity,
    MixedPlan,
    layer_sensitivity,
    mixed_search,
)
from tierlink.quantize.settings import SUFFIXES, QuantSettings

Say = Callable[[str], None]
FASTER = 1.10   # side-by-side speedup that counts as faster (beyond timing noise)
SLOWER = 0.90   # below this, the variant is slower than its parent
SMALLER = 0.90  # file size ratio that counts as smaller

PAYS, SMALLER_ONLY, DOES_NOT_PAY = "pays", "smaller only", "does not pay"


def _quiet_say(_: str) -> None:
    pass


def _model_name(graph: Path) -> str:
    """The model a graph belongs to: its ``<name>/<version>/model.onnx``, or its stem."""
    return graph.parent.parent.name if graph.name == MODEL_FILE else graph.stem


def verdict(accuracy_delta_pt: float, speedup_batch1: float, size_ratio: float,
            budget_pt: float = 0.5) -> str:
    """Whether a variant is worth deploying instead of its parent, on this CPU.

    * ``pays``: it loses at most ``budget_pt`` points of test accuracy and answers one
      image at least 10% faster (batch-1 speedup >= 1.10, side by side) — nodes run
      one request per call.
    * ``smaller only``: within the budget, not slower (speedup >= 0.90) and its file at
      most 90% of the parent's, but not faster: worth it only where memory or download
      size matters.
    * ``does not pay``: anything else — over budget, slower, or neither smaller nor faster.
    """
    if -accuracy_delta_pt > budget_pt + 1e-9 or speedup_batch1 < SLOWER:
        return DOES_NOT_PAY
    if speedup_batch1 >= FASTER:
        return PAYS
    return SMALLER_ONLY if size_ratio <= SMALLER else DOES_NOT_PAY


def card_verdict(card: ModelCard, parent: ModelCard, budget_pt: float = 0.5) -> str:
    """:func:`verdict` from what the variant's card recorded."""
    if card.lineage is None:
        raise QuantizationError(f"{card.name} is not a derived variant")
    return verdict(100.0 * card.lineage.accuracy_delta, card.lineage.speedup["batch1"],
                   card.size_bytes / parent.size_bytes, budget_pt)


def variant_name(parent: str, precision: str) -> str:
    """``fmnist-small`` + ``int8-static`` -> ``fmnist-small-int8``."""
    return f"{parent}-{SUFFIXES[precision]}"


def split_variant_name(name: str, bases: tuple[str, ...]) -> tuple[str, str]:
    """(parent, precision) of a variant name such as ``fmnist-small-mixed``."""
    for parent in sorted(bases, key=len, reverse=True):
        suffix = name[len(parent) + 1:] if name.startswith(parent + "-") else None
        for precision, known in SUFFIXES.items():
            if suffix == known:
                return parent, precision
    raise ModelNotFound(f"{name!r} names no base model and precision suffix of this zoo",
                        hint=f"use <base>-<suffix>: bases {list(bases)}, suffixes "
                             f"{list(SUFFIXES.values())}")


@dataclass(frozen=True, slots=True)
class EvalData:
    """The images a variant is made and judged with: ``calib`` (calibration of INT8
    ranges, temperature, sensitivity) and ``test`` (accuracy, agreement, latency input),
    each a :class:`~tierlink.models.data.Labelled` (the zoo cuts them to its profile's
    evaluation size)."""

    calib: Any
    test: Any




def make_variant_at(root: Path, base: ModelCard, src: Path, settings: QuantSettings,
                    data: EvalData, say: Say = _quiet_say, latency_rounds: int = 30
                    ) -> ModelCard:
    """Make ``base`` (its graph at ``src``) at ``settings`` into the family directory
    ``root`` as ``<name>/<version>/`` (:class:`~tierlink.models.layout.Layout`; installed
    whole, atomically: it registers the variant) and return the card. The caller holds
    whatever lock its family's directory needs."""
    parent = base.name
    if base.lineage is not None:
        raise QuantizationError(f"{parent} is itself a variant; quantize its parent "
                                f"{base.lineage.parent}")
    name = variant_name(parent, settings.precision)
    extra: dict[str, Any] = {}
    with Layout(root).installing(name, base.version) as staging:
        dst, trial = staging / MODEL_FILE, staging / ".trial.onnx"
        if settings.choose_granularity and settings.precision in ("int8-static", "mixed"):
            settings, extra["granularity"] = _pick_granularity(src, settings, data, trial, say)
        if settings.precision == "mixed":
            plan, sensitivity = _search(src, settings, data, staging / ".ranges.json", trial,
                                        say)
            settings = settings.with_exclude(tuple(settings.exclude) + plan.kept_fp32)
            extra |= {"sensitivity": {s.layer: s.drop_pt for s in sensitivity},
                      "search": plan.to_dict()}
        say(f"{name}: quantizing ({settings.precision})")
        result = quantize_model(src, dst, settings, data.calib.input)
        say(f"{name}: measuring against {parent}")
        card = measure_variant(name, base, src, dst, result, settings, data, latency_rounds,
                               extra)
        for leftover in (".ranges.json", ".trial.onnx"):
            (staging / leftover).unlink(missing_ok=True)
        save_card(card, staging / CARD_FILE)
    return card


def _pick_granularity(src: Path, settings: QuantSettings, data: EvalData, trial: Path,
                      say: Say) -> tuple[QuantSettings, dict[str, Any]]:
    """Static INT8 with one weight scale per channel and per tensor, judged on the
    calibration split; the more accurate one wins (a tie keeps ``settings.per_channel``)."""
    from tierlink.models.evaluate import accuracy, onnx_logits

    static = replace(settings, precision="int8-static")
    scores: dict[bool, float] = {}
    for per_channel in (settings.per_channel, not settings.per_channel):
        say(f"{_model_name(src)}: INT8 {'per channel' if per_channel else 'per tensor'} on the "
            f"calibration split")
        quantize_model(src, trial, replace(static, per_channel=per_channel),
                       data.calib.input)
        scores[per_channel] = accuracy(onnx_logits(trial, data.calib.input), data.calib.labels)
    trial.unlink(missing_ok=True)
    best = max(scores, key=lambda pc: (scores[pc], pc == settings.per_channel))
    return (replace(settings, per_channel=best),
            {"per_channel_calib_accuracy": scores[True],
             "per_tensor_calib_accuracy": scores[False], "chosen": "channel" if best
             else "tensor"})


def _search(src: Path, settings: QuantSettings, data: EvalData, ranges: Path, trial: Path,
            say: Say) -> tuple[MixedPlan, tuple[LayerSensitivity, ...]]:
    """Sensitivity scan + mixed-precision search on the calibration split."""
    from tierlink.models.evaluate import accuracy, onnx_logits

    calib = data.calib
    baseline = accuracy(onnx_logits(src, calib.input), calib.labels)
    static = replace(settings, precision="int8-static")
    memo: dict[tuple[str, ...], float] = {}

    def evaluate(excluded: tuple[str, ...]) -> float:
        key = tuple(sorted(set(excluded) | set(settings.exclude)))
        if key not in memo:
            say(f"{_model_name(src)}: sensitivity trial {len(memo) + 1} (FP32: {', '.join(key) or '-'})")
            quantize_model(src, trial, static.with_exclude(key), calib.input,
                           calibration_cache=ranges)
            memo[key] = accuracy(onnx_logits(trial, calib.input), calib.labels)
        return memo[key]

    sensitivity = layer_sensitivity(model_layers(src), evaluate, baseline)
    return mixed_search(sensitivity, evaluate, baseline, settings.budget_pt), sensitivity


def measure_variant(name: str, parent: ModelCard, parent_path: Path, path: Path, result: QuantResult,
                    settings: QuantSettings, data: EvalData, latency_rounds: int,
                    extra: dict[str, Any] | None = None) -> ModelCard:
    """The card of variant ``name`` at ``path``: the parent's card with this file's size,
    hash, accuracies, side-by-side latency (on the CPU provider), fitted temperature, cascade
    curve at the parent's thresholds, and lineage with its verdict."""
    from tierlink.models.calibration import calibrated_card
    from tierlink.models.evaluate import accuracy, onnx_logits
    from tierlink.models.onnx import ort_session
    from tierlink.quantize.timing import side_by_side

    try:
        variant_session = ort_session(path, threads=1)
    except Exception as exc:
        raise QuantizationError(f"the {settings.precision} model does not load in ONNX "
                                f"Runtime on this CPU: {exc}") from exc
    logits = {split: (onnx_logits(parent_path, d.input), onnx_logits(path, d.input))
              for split, d in (("calib", data.calib), ("test", data.test))}
    (p_test, v_test), (_, v_calib) = logits["test"], logits["calib"]
    test_acc = accuracy(v_test, data.test.labels)
    timing = side_by_side({"parent": ort_session(parent_path, 1), "variant": variant_session},
                          _at_least_a_batch(data.test.input), rounds=latency_rounds)
    delta = round(test_acc - accuracy(p_test, data.test.labels), 5)
    speedup = timing.speedup("variant", "parent")
    size = path.stat().st_size
    lineage = Lineage(
        parent=parent.name, parent_sha256=parent.sha256, precision=settings.precision,
        agreement=round(float(np.mean(p_test.argmax(1) == v_test.argmax(1))), 5),
        accuracy_delta=delta, speedup=speedup,
        settings={**settings.to_dict(), "quantized_layers": list(result.quantized),
                  "fp32_layers": list(result.kept), **(extra or {})},
        verdict=verdict(100.0 * delta, speedup["batch1"], size / parent.size_bytes,
                        settings.budget_pt))
    latency = MappingProxyType({k: round(v, 5) for k, v in timing.latency_ms["variant"].items()})
    card = replace(parent, name=name, precision=settings.precision, size_bytes=size,
                   sha256=file_sha256(path), test_accuracy=round(test_acc, 5),
                   calib_accuracy=round(accuracy(v_calib, data.calib.labels), 5),
                   latency_ms=latency, latency_by_provider=MappingProxyType({CPU: latency}),
                   provider=CPU, lineage=lineage)
    thresholds = tuple(p.threshold for p in parent.cascade) or None
    return calibrated_card(card, v_calib, data.calib.labels, v_test, data.test.labels,
                           thresholds)


def _at_least_a_batch(x: np.ndarray) -> np.ndarray:
    """Timing runs 32-sample calls: a smaller evaluation part is repeated to fill one."""
    return x if len(x) >= 32 else np.concatenate([x] * (32 // len(x) + 1))
