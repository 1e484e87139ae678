"""Lower-precision variants of imported models: ``tierlink quantize NAME`` on a model of the
store. The variant is made with the zoo's quantizers (static INT8 calibrated on the model's
*own* calibration data, dynamic INT8, FP16, INT4 weight-only), then imported like any model
— measured on the same data, installed atomically beside its parent — with a ``lineage``
(parent, its sha256, precision, top-1 agreement, accuracy delta, side-by-side speedup).
Imported classifiers with one input; others are refused with the reason."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import QuantizationError
from tierlink.modelstore.importer import ImportRequest, import_model
from tierlink.modelstore.store import ModelStore
from tierlink.quantize.settings import QuantSettings


def quantize_imported(store: ModelStore, parent: str, settings: QuantSettings,
                      say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Make, measure and install ``parent``'s variant at ``settings``; its card."""
    from tierlink.models.data import split
    from tierlink.quantize.methods import quantize_model
    from tierlink.quantize.variants import variant_name

    if settings.precision == "mixed":
        raise QuantizationError("mixed precision searches the zoo's layers; imported models "
                                "take int8, int8dyn, fp16 or int4w")
    card = store.card(parent)
    if card.get("lineage"):
        raise QuantizationError(f"{parent} is itself a variant; quantize its parent "
                                f"{card['lineage']['parent']}")
    onnx = store.graph(parent, "quantize")
    store.single_input_classifier(parent, "quantize")
    data = store.load_data(card["data"]["sha256"])
    parts = split(data, float(card["data"]["calib_share"]), int(card["data"]["seed"]))
    name = variant_name(parent, settings.precision)
    with tempfile.TemporaryDirectory(prefix="tierlink-quantize-") as tmp:
        variant = Path(tmp) / f"{name}.onnx"
        say(f"{name}: quantizing ({settings.precision})")
        result = quantize_model(onnx, variant, settings, parts.calib.input)
        data_file = Path(tmp) / "data.npz"
        arrays: dict[str, Any] = {"y": data.labels, **dict(data.inputs)}
        np.savez(data_file, **arrays)
        say(f"{name}: measuring it on {parent}'s data")
        new = import_model(ImportRequest(
            name=name, model=variant, task=card["task"], tier=card["tier"], data=data_file,
            calib_share=float(card["data"]["calib_share"]), seed=int(card["data"]["seed"]),
            version=str(card["version"])), store)
        new["data"]["source"] = card["data"]["source"]
        new["lineage"] = _lineage(store, parent, name, card, settings, result, parts)
    store.update_card(name, new)
    return new


def _lineage(store: ModelStore, parent: str, name: str, card: dict[str, Any],
             settings: QuantSettings, result: Any, parts: Any) -> dict[str, Any]:
    from tierlink.models.evaluate import run
    from tierlink.models.onnx import open_session
    from tierlink.quantize.timing import side_by_side

    sessions = {k: open_session(store.paths(n)[0]).session
                for k, n in (("parent", parent), ("variant", name))}
    x = parts.test.inputs
    answers = {k: run(s, x) for k, s in sessions.items()}
    top1 = {k: next(iter(v.values())).argmax(axis=1) for k, v in answers.items()}
    inputs = next(iter(x.values()))
    if len(inputs) < 32:  # side_by_side times batches of 32
        inputs = np.concatenate([inputs] * (32 // len(inputs) + 1))
    timing = side_by_side(sessions, inputs, rounds=10)
    from tierlink.quantize.variants import verdict

    variant = store.card(name)
    speedup = timing.speedup("variant", "parent")
    delta = float(variant["metric"]["eval"] - card["metric"]["eval"])
    return {"parent": parent, "parent_sha256": card["sha256"],
            "verdict": verdict(100.0 * delta, speedup["batch1"],
                               variant["size_bytes"] / card["size_bytes"], settings.budget_pt),
            "precision": settings.precision,
            "agreement": round(float(np.mean(top1["parent"] == top1["variant"])), 5),
            "accuracy_delta": round(delta, 5), "speedup": speedup,
            "settings": {**settings.to_dict(), "quantized_layers": list(result.quantized),
                         "fp32_layers": list(result.kept)}}


