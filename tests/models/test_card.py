import json
import math

import pytest

from tierlink.core.types import CascadePoint, ModelView
from tierlink.errors import ModelError
from tierlink.models.card import card_from_dict, load_card, save_card


def card_dict(**overrides):
    data = {
        "task": "fmnist", "name": "fmnist-small", "variant": "small", "version": "1",
        "tier": "device", "params": 24058, "size_bytes": 97702, "sha256": "ab" * 32,
        "input": {"name": "input", "datatype": "FP32", "shape": [-1, 1, 28, 28]},
        "output": {"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
        "labels": [f"c{i}" for i in range(10)], "test_accuracy": 0.91,
        "calib_accuracy": 0.912,
        "latency_ms": {"batch1_p50": 0.1, "batch1_p95": 0.2, "batch32_per_sample": 0.05},
        "cascade": [{"threshold": 0.5, "answered_share": 0.99, "answered_accuracy": 0.92},
                    {"threshold": 0.9, "answered_share": 0.8, "answered_accuracy": 0.98}],
        "temperature": 1.0,
        "training": {"epochs": 3, "seed": 0, "seconds": 30.5, "profile": "full",
                     "torch_version": "2.13.0+cpu"},
    }
    data.update(overrides)
    return data


def test_a_card_round_trips_through_json(tmp_path):
    card = card_from_dict(card_dict())
    save_card(card, tmp_path / "c.json")
    again = load_card(tmp_path / "c.json")
    assert again == card
    assert again.input.shape == (-1, 1, 28, 28) and again.output.name == "logits"
    assert again.cascade[1] == CascadePoint(0.9, 0.8, 0.98)
    assert again.latency_ms["batch1_p95"] == 0.2
    assert json.loads((tmp_path / "c.json").read_text())["training"]["epochs"] == 3


@pytest.mark.parametrize("field", ["name", "task"])
def test_a_missing_field_is_named(field):
    data = card_dict()
    del data[field]
    with pytest.raises(ModelError, match=f"lacks field.*'{field}'"):
        card_from_dict(data)


def test_missing_nested_fields_are_named():
    with pytest.raises(ModelError, match="'training'.*'seed'"):
        card_from_dict(card_dict(training={"epochs": 1}))
    with pytest.raises(ModelError, match="'batch1_p50'"):
        card_from_dict(card_dict(latency_ms={"batch1_p95": 1.0, "batch32_per_sample": 1.0}))


def test_malformed_values_and_files_are_zoo_errors(tmp_path):
    with pytest.raises(ModelError, match="tier"):
        card_from_dict(card_dict(tier="fog"))
    with pytest.raises(ModelError, match="malformed"):
        card_from_dict(card_dict(params="many"))
    with pytest.raises(ModelError, match="cannot read"):
        load_card(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot read"):
        load_card(tmp_path / "bad.json")


def test_as_model_view_carries_accuracy_latency_and_cascade():
    card = card_from_dict(card_dict())
    view = card.as_model_view()
    assert isinstance(view, ModelView)
    assert (view.name, view.task, view.version) == ("fmnist-small", "fmnist", "1")
    assert view.accuracy == 0.91 and view.latency_ms == 0.1
    assert view.cascade_at(0.95) == CascadePoint(0.9, 0.8, 0.98)
    assert card.as_model_view(latency_ms=2.5).latency_ms == 2.5


# --- one card for every model; the shapes written before it still load --------------------

def imported_v1(**overrides):
    """An import's card as tierlink wrote it before the card was one."""
    data = {
        "name": "spam", "task": "spam", "kind": "classification", "tier": "edge",
        "version": "2", "imported": True, "format": "python", "file": "model.zip",
        "entry": "model:Model", "sha256": "cd" * 32, "size_bytes": 900, "params": 0,
        "input": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "output": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}],
        "labels": ["ham", "spam"], "metric": {"name": "accuracy", "calib": 0.9, "eval": 0.88},
        "test_accuracy": 0.88, "calib_accuracy": 0.9, "temperature": 1.3,
        "calibration": {"nll_before": 0.4, "nll_after": None, "ece_before": 0.05,
                        "ece_after": 0.02, "eval_ece_before": 0.06, "eval_ece_after": 0.03},
        "cascadable": True,
        "cascade": [{"threshold": 0.6, "answered_share": 0.9, "answered_accuracy": 0.93}],
        "latency_ms": {"batch1_p50": 0.3, "batch1_p95": 0.4, "batch32_per_sample": 0.02},
        "latency_ms_by_provider": {"python": {"batch1_p50": 0.3, "batch1_p95": 0.4,
                                              "batch32_per_sample": 0.02}},
        "provider": "python",
        "data": {"sha256": "ef" * 32, "source": "d.npz", "seed": 0, "calib_share": 0.5,
                 "calib_samples": 50, "eval_samples": 50},
        "task_spec": {"kind": "classification",
                      "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                      "labels": ["ham", "spam"]},
        "import_s": 1.5,
    }
    data.update(overrides)
    return data


def test_an_imported_models_old_card_reads_as_the_one_card(tmp_path):
    card = card_from_dict(imported_v1())
    assert (card.format, card.file, card.entry, card.tier) == ("python", "model.zip",
                                                               "model:Model", "edge")
    assert card.imported and card.cascadable and card.kind == "classification"
    assert card.inputs[0].name == "x" and card.outputs[0].shape == (-1, 2)
    assert card.metric == "accuracy" and card.test_accuracy == 0.88
    assert card.calibration.test_ece_after == 0.03 and math.isnan(card.calibration.nll_after)
    assert card.latency_on("python")["batch1_p50"] == 0.3 and card.latency_on("CUDA") is None
    assert card.data.eval_samples == 50 and card.task_spec.labels == ("ham", "spam")
    save_card(card, tmp_path / "card.json")
    written = json.loads((tmp_path / "card.json").read_text())
    assert written["schema"] == 2 and written["calibration"]["nll_after"] is None
    assert load_card(tmp_path / "card.json") == card


def test_a_language_models_old_card_reads_as_the_one_card():
    card = card_from_dict({
        "name": "smollm2-135m", "kind": "causal_lm", "architecture": "llama",
        "parameters": 134_515_008, "bytes": 538_000_000, "source": {"gguf": "x.gguf"},
        "tokenizer": {"kind": "hf", "vocab_size": 49152, "chat_template": True},
        "context_length": 2048, "layers": 30, "hidden_size": 576, "kv_bytes_per_token": 46080,
        "prefill_tokens_per_s": 410.2, "decode_tokens_per_s": 31.5,
        "measured": {"threads": 1}, "precision": "fp32", "measured_for": "k"})
    assert (card.format, card.kind, card.params, card.file) == (
        "llm", "causal_lm", 134_515_008, "model.safetensors")
    assert card.language.decode_tokens_per_s == 31.5 and card.language.measured_for == "k"
    assert card_from_dict(card.to_dict()) == card


def test_a_card_of_a_newer_schema_is_refused_with_the_way_out():
    with pytest.raises(ModelError, match="schema 3") as info:
        card_from_dict(card_dict(schema=3))
    assert "upgrade tierlink" in info.value.hint


def test_a_malformed_section_is_named():
    with pytest.raises(ModelError, match="'data'.*calib_share"):
        card_from_dict(imported_v1(data={"sha256": "x", "source": "d", "seed": 0}))
