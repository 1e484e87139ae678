"""A user's multi-exit model imported: its segments chained, measured on its own data as the
zoo's net is, installed as one package and served by the multi-exit runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import byo_support as byo
from tierlink.errors import ImportRefused
from tierlink.models import runtimes
from tierlink.models.runtimes import LoadSpec
from tierlink.modelstore.importer import ImportRequest, import_model


def request(tmp_path: Path, model: Path, **extra: object) -> ImportRequest:
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    fields: dict = {"model_format": "multi-exit", **extra}
    return ImportRequest("toy-exits", model, "toy", "device", data, **fields)


def test_a_multi_exit_model_is_measured_installed_and_served(model_store, tmp_path):
    card = import_model(request(tmp_path, byo.multi_exit(tmp_path / "segments")), model_store)
    net = card.multi_exit
    assert (card.format, card.file, card.tier, card.kind) == (
        "multi-exit", "model.zip", "device", "classification")
    assert [s.file for s in net.segments] == ["b-head.onnx", "a-tail.onnx"]  # chain order
    assert [e.name for e in net.exits] == ["exit1", "logits"]
    assert [b.name for b in net.boundaries] == ["features"]
    assert net.whole == {} and card.data.calib_samples == 100
    # Exit 1 gives the classifier's classes: the same accuracy at both exits.
    assert net.exits[0].test_accuracy == net.exits[1].test_accuracy == card.test_accuracy
    assert card.cascadable and card.inputs[0].name == "x"
    assert model_store.card("toy-exits") == card
    model, card_path = model_store.paths("toy-exits")
    assert model.name == "model.zip"
    rt = runtimes.load(LoadSpec(card=card_path, model_file=model))
    x = byo.features(6, seed=3)
    out = rt.infer({"x": x})
    assert out["exit"].shape == (6,) and set(out["exit"].tolist()) <= {0, 1}
    np.testing.assert_array_equal(np.exp(out["logits"]).argmax(axis=1),
                                  (x @ byo.W_CLS + byo.B_CLS).argmax(axis=1))
    assert rt.info.task == "toy" and rt.info.accuracy == card.test_accuracy


def test_segments_that_do_not_chain_are_refused(model_store, tmp_path):
    segments = byo.multi_exit(tmp_path / "segments")
    byo.classifier(segments / "c-stray.onnx", input_name="other")
    with pytest.raises(ImportRefused, match="do not form one chain"):
        import_model(request(tmp_path, segments), model_store)
    one = tmp_path / "one"
    byo.classifier(one / "m.onnx")
    with pytest.raises(ImportRefused, match="two or more segments"):
        import_model(request(tmp_path, one), model_store)
    with pytest.raises(ImportRefused, match="--format 'tflite'"):
        import_model(request(tmp_path, one, model_format="tflite"), model_store)
    assert model_store.names() == []


def test_it_joins_a_task_an_onnx_model_declared_and_cascades_with_it(model_store, tmp_path):
    from tierlink.cascade.stages import Chain
    from tierlink.core.types import Tier
    from tierlink.modelstore.stages import imported_stages

    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    import_model(ImportRequest("toy-cloud", byo.classifier(tmp_path / "c.onnx"), "toy",
                               "cloud", data), model_store)
    import_model(request(tmp_path, byo.multi_exit(tmp_path / "segments")), model_store)
    stages = imported_stages(model_store, Chain(("toy-exits", "toy-cloud"),
                                                (Tier.DEVICE, Tier.CLOUD)))
    assert [s.model for s in stages.calib] == ["toy-exits", "toy-cloud"]
    assert stages.eval[0].correct.mean() == pytest.approx(
        model_store.card("toy-exits").test_accuracy)
