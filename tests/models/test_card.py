import json

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


@pytest.mark.parametrize("field", ["sha256", "cascade", "training", "latency_ms"])
def test_a_missing_field_is_named(field):
    data = card_dict()
    del data[field]
    with pytest.raises(ModelError, match=f"lacks field.*'{field}'"):
        card_from_dict(data)


def test_missing_nested_fields_are_named():
    with pytest.raises(ModelError, match="'training'.*'seed'"):
        card_from_dict(card_dict(training={"epochs": 1}))
    with pytest.raises(ModelError, match="'batch1_p95'"):
        card_from_dict(card_dict(latency_ms={"batch1_p50": 1.0, "batch32_per_sample": 1.0}))


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
