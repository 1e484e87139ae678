"""Variants of the test-profile zoo's models, made into a temporary copy of the zoo: each
precision yields a card the zoo then lists, stale variants are ignored, ensure_variant is
idempotent, the CLI reports as JSON."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tierlink.errors import QuantizationError
from tierlink.models.card import file_sha256, save_card
from tierlink.quantize.methods import quantize_model
from tierlink.quantize.settings import PRECISIONS, QuantSettings
from tierlink.quantize.variants import EvalData, card_verdict, variant_name
from tierlink.zoo.cache import Zoo, ensure_zoo, load_zoo
from tierlink.zoo.datasets import fashion_mnist
from tierlink.zoo.variants import ensure_variant, make_variant

PARENT = "fmnist-small"


def copy_zoo(dst: Path) -> Zoo:
    src = ensure_zoo(profile="test", progress=False)  # built once per machine, then cached
    dst.mkdir(parents=True, exist_ok=True)
    for name in src.base_names():  # each model's directory, in the framework's layout
        shutil.copytree(src.root / name, dst / name)
    return load_zoo(profile="test", root=dst)


@pytest.fixture(scope="module")
def data() -> EvalData:
    splits = fashion_mnist()
    return EvalData(splits.calib.head(256), splits.test.head(200))


@pytest.fixture(scope="module")
def made(tmp_path_factory, data):
    """Every precision of fmnist-small, made once into one zoo copy."""
    zoo = copy_zoo(tmp_path_factory.mktemp("zoo"))
    cards = {p: make_variant(zoo, PARENT, QuantSettings(precision=p, calib_size=128),
                             data=data, latency_rounds=1) for p in PRECISIONS}
    return zoo, cards


@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_precision_registers_a_measured_variant(made, precision: str) -> None:
    zoo, cards = made
    card, parent = cards[precision], zoo.card(PARENT)
    listed = load_zoo(profile="test", root=zoo.root)
    assert card.name == variant_name(PARENT, precision) in listed.cards
    assert listed.cards[card.name] == card and card.name in listed.variants(PARENT)
    assert card.name not in listed.base_names()
    assert card.precision == precision and card.parent == PARENT
    assert (card.task, card.labels, card.input, card.tier) == \
        (parent.task, parent.labels, parent.input, parent.tier)
    lineage = card.lineage
    assert lineage is not None and lineage.parent_sha256 == parent.sha256
    assert card.sha256 == file_sha256(listed.path(card.name))
    assert listed.path(card.name) == zoo.root / card.name / card.version / "model.onnx"
    assert 0.0 <= lineage.agreement <= 1.0 and 0.0 <= card.test_accuracy <= 1.0
    assert card.calibration is not None and card.calibration.samples == 256
    assert set(lineage.speedup) == {"batch1", "batch32"}
    assert all(v > 0 for v in card.latency_ms.values())
    assert card_verdict(card, parent) in ("pays", "smaller only", "does not pay")


def test_accuracy_fields_agree_with_the_parent(made, data) -> None:
    from tierlink.models.evaluate import accuracy, onnx_logits

    zoo, cards = made
    parent_acc = accuracy(onnx_logits(zoo.path(PARENT), data.test.input), data.test.labels)
    for card in cards.values():
        assert card.lineage.accuracy_delta == pytest.approx(card.test_accuracy - parent_acc,
                                                            abs=2e-5)
    # FP16 and INT4 weight-only barely move the predictions; every precision shrinks the file.
    assert cards["fp16"].lineage.agreement >= 0.98
    assert all(c.size_bytes < zoo.card(PARENT).size_bytes for c in cards.values())


def test_int4_names_its_layers_and_mixed_records_its_search(made) -> None:
    _, cards = made
    int4 = cards["int4-weight"].lineage.settings
    assert int4["quantized_layers"] and all("Gemm" in n for n in int4["quantized_layers"])
    assert any("Conv" in n for n in int4["fp32_layers"])
    mixed = cards["mixed"].lineage.settings
    assert set(mixed["sensitivity"]) == set(int4["quantized_layers"]) | set(int4["fp32_layers"])
    assert mixed["search"]["met"] and mixed["fp32_layers"] == mixed["search"]["kept_fp32"]


def test_a_variant_of_an_older_parent_is_ignored_and_remade(tmp_path, data) -> None:
    zoo = copy_zoo(tmp_path / "zoo")
    make_variant(zoo, PARENT, QuantSettings(precision="fp16"), data=data, latency_rounds=1)
    assert f"{PARENT}-fp16" in load_zoo(profile="test", root=zoo.root).cards
    # "Rebuild" the parent: new bytes, a card that matches them.
    model = onnx.load(str(zoo.path(PARENT)))
    model.doc_string = "rebuilt"
    onnx.save(model, str(zoo.path(PARENT)))
    save_card(replace(zoo.card(PARENT), sha256=file_sha256(zoo.path(PARENT))),
              zoo.card_path(PARENT))
    fresh = load_zoo(profile="test", root=zoo.root)
    assert f"{PARENT}-fp16" not in fresh.cards
    card = ensure_variant(fresh, f"{PARENT}-fp16", data=data, latency_rounds=1)
    assert card.lineage.parent_sha256 == fresh.card(PARENT).sha256
    assert f"{PARENT}-fp16" in load_zoo(profile="test", root=zoo.root).cards


def test_ensure_variant_is_idempotent(made, data) -> None:
    zoo, _ = made
    name = f"{PARENT}-int4w"
    listed = load_zoo(profile="test", root=zoo.root)
    before = listed.card_path(name).stat().st_mtime_ns
    assert ensure_variant(listed, name, data=data) == listed.cards[name]
    assert ensure_variant(listed, PARENT) == listed.card(PARENT)  # a base model: itself
    assert listed.card_path(name).stat().st_mtime_ns == before


def test_methods_that_cannot_apply_say_so(made, tmp_path) -> None:
    zoo, _ = made
    with pytest.raises(QuantizationError, match="no such layer"):
        quantize_model(zoo.path(PARENT), tmp_path / "x.onnx",
                       QuantSettings(exclude=("/nope/Conv",)), np.zeros((4, 1, 28, 28)))
    with pytest.raises(QuantizationError, match="calibration images"):
        quantize_model(zoo.path(PARENT), tmp_path / "x.onnx", QuantSettings(), None)
    conv_only = tmp_path / "conv.onnx"
    onnx.save(_conv_only_model(), str(conv_only))
    with pytest.raises(QuantizationError, match="INT4"):
        quantize_model(conv_only, tmp_path / "y.onnx", QuantSettings(precision="int4-weight"))


def test_cli_json(tmp_path, monkeypatch) -> None:
    from typer import Typer
    from typer.testing import CliRunner

    from tierlink.cli.quantize import quantize

    home = tmp_path / "home"
    copy_zoo(home / "zoo" / "test")
    monkeypatch.setenv("TIERLINK_HOME", str(home))
    app = Typer()
    app.command()(quantize)
    result = CliRunner().invoke(app, [PARENT, "--precision", "int4w", "--profile", "test",
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [v["name"] for v in doc["variants"]] == [f"{PARENT}-int4w"]
    bad = CliRunner().invoke(app, [PARENT, "--precision", "int3", "--profile", "test"])
    assert bad.exit_code == 2 and "int3" in bad.output


def _conv_only_model() -> onnx.ModelProto:
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 3, 3], [0.1] * 18)
    node = helper.make_node("Conv", ["input", "w"], ["logits"], name="/1/Conv")
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                             [1, 1, 28, 28])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                             None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_static_int8_keeps_the_more_accurate_weight_granularity(made) -> None:
    _, cards = made
    for precision in ("int8-static", "mixed"):
        settings = cards[precision].lineage.settings
        trial = settings["granularity"]
        channel, tensor = trial["per_channel_calib_accuracy"], trial["per_tensor_calib_accuracy"]
        chosen = "channel" if channel >= tensor else "tensor"
        assert trial["chosen"] == chosen
        assert settings["per_channel"] == (chosen == "channel")
