"""tierlink.quantize: lower-precision variants of a model, each with a measured card.

    card = make_variant_at(root, parent_card, parent_onnx,
                           QuantSettings(precision="int8-static"), data)

(the zoo makes its variants on first use with it: :mod:`tierlink.zoo.variants`; an
imported model's: :mod:`tierlink.modelstore.quantize`).

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
    from tierlink.quantize.variants import card_verdict, make_variant_at, variant_name, verdict

_LAZY = {
    "QuantResult": "methods", "quantize_model": "methods",
    "LayerSensitivity": "sensitivity", "MixedPlan": "sensitivity",
    "layer_sensitivity": "sensitivity", "mixed_search": "sensitivity",
    "PRECISIONS": "settings", "SUFFIXES": "settings", "QuantSettings": "settings",
    "precision_for": "settings", "card_verdict": "variants",
    "make_variant_at": "variants", "variant_name": "variants", "verdict": "variants",
}

__all__ = [
    "PRECISIONS", "SUFFIXES", "LayerSensitivity", "MixedPlan", "QuantResult", "QuantSettings",
    "card_verdict", "layer_sensitivity", "make_variant_at", "mixed_search",
    "precision_for", "quantize_model", "variant_name", "verdict",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tierlink.quantize' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"tierlink.quantize.{module}"), name)
