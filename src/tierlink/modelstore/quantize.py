"""Lower-precision variants of imported models: ``tierlink quantize NAME`` on a model of the
store. The variant is made and measured exactly as a zoo model's
(:func:`tierlink.quantize.variants.make_variant_at`: static INT8 calibrated on the model's
*own* calibration data, dynamic INT8, FP16, INT4 weight-only or a mixed-precision search),
on the data the parent was imported with, and installed beside it with its lineage (parent,
its sha256, precision, top-1 agreement, accuracy delta, side-by-side speedup, verdict).
Imported ONNX classifiers with one input; others are refused with the reason."""

from __future__ import annotations

from tierlink.models.card import ModelCard
from tierlink.modelstore.store import ModelStore
from tierlink.quantize.settings import QuantSettings
from tierlink.quantize.variants import EvalData, Say, make_variant_at


def quantize_imported(store: ModelStore, parent: str, settings: QuantSettings,
                      say: Say = lambda m: None) -> ModelCard:
    """Make, measure and install ``parent``'s variant at ``settings``; its card."""
    card = store.card(parent)
    graph = store.graph(parent, "quantize")
    store.single_input_classifier(parent, "quantize")
    parts = store.splits(parent)
    return make_variant_at(store.root, card, graph, settings,
                           EvalData(parts.calib, parts.test), say)
