"""Quantized variants of imported models: made with the zoo's quantizers, calibrated and
measured on the model's own data, installed beside the parent with their lineage."""

from __future__ import annotations

from pathlib import Path

import pytest

import byo_support as byo
from tierlink.errors import ImportRefused, QuantizationError
from tierlink.modelstore.importer import ImportRequest, import_model
from tierlink.modelstore.quantize import quantize_imported
from tierlink.quantize.settings import QuantSettings


def parent(store, tmp_path: Path, kind: str = "classification") -> str:
    if kind == "classification":
        x, y = byo.classification_data(160)
        onnx = byo.classifier(tmp_path / "p.onnx")
    else:
        x, y = byo.regression_data(160)
        onnx = byo.regression(tmp_path / "p.onnx", uncertainty=False)
    import_model(ImportRequest("toy", onnx, "toy", "cloud",
                               byo.save_npz(tmp_path / "d.npz", x=x, y=y), kind=kind), store)
    return "toy"


@pytest.mark.parametrize("precision", ["int8-static", "int8-dynamic", "fp16"])
def test_a_variant_is_measured_on_the_parents_data_and_installed(model_store, tmp_path,
                                                                 precision):
    name = parent(model_store, tmp_path)
    card = quantize_imported(model_store, name, QuantSettings(precision=precision,
                                                              calib_size=64))
    stored = model_store.card(card["name"])
    assert stored == card and card["name"].startswith("toy-")
    assert card["task"] == "toy" and card["tier"] == "cloud"
    assert card["data"]["sha256"] == model_store.card(name)["data"]["sha256"]
    lineage = card["lineage"]
    assert lineage["parent"] == name and lineage["precision"] == precision
    assert lineage["parent_sha256"] == model_store.card(name)["sha256"]
    assert lineage["agreement"] > 0.9 and abs(lineage["accuracy_delta"]) < 0.1
    assert set(lineage["speedup"]) == {"batch1", "batch32"}
    assert lineage["verdict"] in ("pays", "smaller only", "does not pay")


def test_a_variant_of_a_variant_and_mixed_precision_are_refused(model_store, tmp_path):
    name = parent(model_store, tmp_path)
    with pytest.raises(QuantizationError, match="mixed"):
        quantize_imported(model_store, name, QuantSettings(precision="mixed"))
    variant = quantize_imported(model_store, name, QuantSettings(precision="fp16"))["name"]
    with pytest.raises(QuantizationError, match="itself a variant"):
        quantize_imported(model_store, variant, QuantSettings(precision="fp16"))


def test_a_model_without_top1_answers_is_refused(model_store, tmp_path):
    name = parent(model_store, tmp_path, "regression")
    with pytest.raises(ImportRefused, match="regression"):
        quantize_imported(model_store, name, QuantSettings(precision="fp16"))
    assert model_store.names() == [name]
