"""tierlink.quantize: lower-precision variants of zoo models, each with a measured card.

    zoo = load_zoo()
    card = make_variant(zoo, "fmnist-large", QuantSettings(precision="int8-static"))
    card = ensure_variant(zoo, "fmnist-small-mixed")   # what a fleet config names

Layout: ``settings`` (what to make, validated), ``methods`` (ONNX Runtime quantization:
static / dynamic INT8, FP16, INT4 weight-only), ``sensitivity`` (per-layer scan and the
mixed-precision search, pure), ``timing`` (side-by-side latency), ``variants`` (measure,
card, register, verdict), ``report`` (tables, PNG). Importing this package loads none of
them; ONNX Runtime's quantization tooling loads only when a model is quantized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierlink.quantize.methods import QuantResult, quantize_model
    from tierlink.quantize.sensitivity import (
        LayerSensitivity,
        MixedPlan,
        layer_sensitivity,
        mixed_search,
    )
    from tierlink.quantize.settings import PRECISIONS, SUFFIXES, QuantSettings, precision_for
    from tierlink.quantize.variants import (
        card_verdict,
        ensure_variant,
        make_variant,
        variant_name,
        verdict,
    )

_LAZY = {
    "QuantResult": "methods", "quantize_model": "methods",
    "LayerSensitivity": "sensitivity", "MixedPlan": "sensitivity",
    "layer_sensitivity": "sensitivity", "mixed_search": "sensitivity",
    "PRECISIONS": "settings", "SUFFIXES": "settings", "QuantSettings": "settings",
    "precision_for": "settings", "card_verdict": "variants", "ensure_variant": "variants",
    "make_variant": "variants", "variant_name": "variants", "verdict": "variants",
}

__all__ = [
    "PRECISIONS", "SUFFIXES", "LayerSensitivity", "MixedPlan", "QuantResult", "QuantSettings",
    "card_verdict", "ensure_variant", "layer_sensitivity", "make_variant", "mixed_search",
    "precision_for", "quantize_model", "variant_name", "verdict",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tierlink.quantize' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"tierlink.quantize.{module}"), name)
