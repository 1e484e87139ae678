"""Quantized variants of imported models: made and measured as the zoo's are
(``make_variant_at``), calibrated and measured on the model's own data, installed beside the
parent with their lineage."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import byo_support as byo
from tierlink.errors import ImportRefused, QuantizationError
from tierlink.models.card import ModelCard
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
    assert isinstance(card, ModelCard)
    stored = model_store.card(card.name)
    assert stored == card and card.name.startswith("toy-") and card.name != name
    assert model_store.names("toy") == sorted([name, card.name])
    base = model_store.card(name)
    assert card.task == "toy" and card.tier == "cloud" and card.version == base.version
    assert card.kind == "classification" and card.precision == precision
    assert card.imported and card.data == base.data  # measured on the parent's data
    assert card.sha256 != base.sha256 and card.sha256 == \
        hashlib.sha256(model_store.paths(card.name)[0].read_bytes()).hexdigest()
    assert 0.0 < card.test_accuracy < 1.0 and 0.0 < card.calib_accuracy < 1.0
    assert card.latency_ms["batch1_p50"] > 0
    lineage = card.lineage
    assert lineage is not None and card.parent == name
    assert lineage.parent == name and lineage.precision == precision
    assert lineage.parent_sha256 == base.sha256
    assert lineage.agreement > 0.9 and abs(lineage.accuracy_delta) < 0.1
    assert lineage.accuracy_delta == pytest.approx(card.test_accuracy - base.test_accuracy,
                                                   abs=1e-4)
    assert set(lineage.speedup) == {"batch1", "batch32"}
    assert isinstance(lineage.verdict, str)
    assert lineage.verdict in ("pays", "smaller only", "does not pay")
    assert lineage.settings["precision"] == precision
    # the cascade curve is measured at the parent's thresholds
    assert [p.threshold for p in card.cascade] == [p.threshold for p in base.cascade]


def test_a_variant_of_a_variant_is_refused(model_store, tmp_path):
    name = parent(model_store, tmp_path)
    variant = quantize_imported(model_store, name, QuantSettings(precision="fp16")).name
    with pytest.raises(QuantizationError, match="itself a variant"):
        quantize_imported(model_store, variant, QuantSettings(precision="fp16"))
    assert model_store.names() == sorted([name, variant])


def test_mixed_precision_searches_an_imported_model_as_the_zoos(model_store, tmp_path):
    name = parent(model_store, tmp_path)
    card = quantize_imported(model_store, name, QuantSettings(precision="mixed",
                                                              calib_size=64))
    assert model_store.card(card.name) == card and card.precision == "mixed"
    assert card.lineage is not None and card.lineage.parent == name
    assert card.lineage.precision == "mixed"
    assert {"sensitivity", "search"} <= set(card.lineage.settings)
    assert card.lineage.verdict in ("pays", "smaller only", "does not pay")


def test_a_model_without_top1_answers_is_refused(model_store, tmp_path):
    name = parent(model_store, tmp_path, "regression")
    with pytest.raises(ImportRefused, match="regression"):
        quantize_imported(model_store, name, QuantSettings(precision="fp16"))
    assert model_store.names() == [name]
