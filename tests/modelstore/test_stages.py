"""Cascade stages of imported models (``modelstore/stages.py``): what ``cascade tune`` reads
for a chain of users' models, and the chains it refuses."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest

import byo_support as byo
from tierlink.cascade.stages import Chain
from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.models.tensors import TensorDecl
from tierlink.modelstore.importer import ImportRequest, import_model
from tierlink.modelstore.stages import imported_stages


@pytest.fixture
def chain_store(model_store, tmp_path):
    """Two classifiers of one task imported with the same data (one gives probabilities)."""
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    import_model(ImportRequest("small", byo.classifier(tmp_path / "small.onnx"), "t", "device",
                               data), model_store)
    import_model(ImportRequest("large", byo.classifier(tmp_path / "large.onnx", output="scores"),
                               "t", "cloud", data), model_store)
    return model_store


def test_each_model_of_the_chain_is_a_stage_on_both_parts(chain_store):
    stages = imported_stages(chain_store, Chain(("small", "large"), (Tier.DEVICE, Tier.CLOUD)))
    assert [s.model for s in stages.calib] == ["small", "large"]
    assert [s.tier for s in stages.eval] == [Tier.DEVICE, Tier.CLOUD]
    for part, n in ((stages.calib, 100), (stages.eval, 100)):
        for stage in part:
            assert stage.confidence.shape == (n,) and stage.correct.dtype == bool
            assert 0.0 < stage.correct.mean() < 1.0 and stage.cost > 0
    card = chain_store.card("small")
    assert stages.eval[0].correct.mean() == pytest.approx(card.test_accuracy)
    assert stages.calib[0].correct.mean() == pytest.approx(card.calib_accuracy)
    assert stages.tuned_on == {m: chain_store.card(m).sha256 for m in ("small", "large")}
    # the same model on the cloud costs more than on the device
    assert stages.calib[1].cost > stages.calib[0].cost


def test_a_chain_measured_on_different_data_is_refused(chain_store, tmp_path):
    x, y = byo.classification_data(seed=9)
    import_model(ImportRequest("other", byo.classifier(tmp_path / "o.onnx"), "t", "edge",
                               byo.save_npz(tmp_path / "o.npz", x=x, y=y)), chain_store)
    with pytest.raises(ConfigError, match="was imported with different data"):
        imported_stages(chain_store, Chain(("small", "other"), (Tier.DEVICE, Tier.EDGE)))


def test_a_model_without_confidence_cannot_be_a_stage(model_store, tmp_path):
    x, y = byo.regression_data()
    data = byo.save_npz(tmp_path / "r.npz", x=x, y=y)
    import_model(ImportRequest("reg", byo.regression(tmp_path / "r.onnx", uncertainty=False),
                               "price", "device", data, kind="regression",
                               options=MappingProxyType({"tolerance": 0.3})), model_store)
    with pytest.raises(ConfigError, match="reg cannot be cascaded: its regression task"):
        imported_stages(model_store, Chain(("reg",), (Tier.DEVICE,)))


def test_a_regression_with_uncertainty_and_tolerance_is_a_stage(model_store, tmp_path):
    x, y = byo.regression_data()
    import_model(ImportRequest("reg", byo.regression(tmp_path / "r.onnx"), "price", "device",
                               byo.save_npz(tmp_path / "r.npz", x=x, y=y), kind="regression",
                               outputs=MappingProxyType({"value": "value", "uncertainty": "sd"}),
                               options=MappingProxyType({"tolerance": 0.3})), model_store)
    stage = imported_stages(model_store, Chain(("reg",), (Tier.DEVICE,))).calib[0]
    assert stage.confidence.shape == (100,)  # 1 / (1 + sd): in (0, 1], varying per input
    assert ((0 < stage.confidence) & (stage.confidence <= 1)).all()
    assert len(np.unique(stage.confidence)) > 50
    assert 0.0 < stage.correct.mean() < 1.0


def test_a_python_model_and_an_onnx_model_in_one_chain(model_store, tmp_path):
    """A user's Python classifier on the device, an ONNX graph in the cloud: imported with
    the same data, measured alike, cascaded in one chain."""
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    py = import_model(ImportRequest("py-small", byo.python_classifier(tmp_path / "src",
                                                                      scale=0.5),
                                    "t", "device", data), model_store)
    graph = import_model(ImportRequest("onnx-large", byo.classifier(tmp_path / "large.onnx"),
                                       "t", "cloud", data), model_store)
    assert (py.format, py.file, py.entry) == ("python", "model.zip", "model:Model")
    assert py.outputs == (TensorDecl("logits", "FP32", (-1, 3)),)
    # the same answers (weights halved: less sure, same argmax), so the same accuracy
    assert py.test_accuracy == graph.test_accuracy
    assert py.temperature == pytest.approx(graph.temperature * 0.5, rel=0.02)
    stages = imported_stages(model_store, Chain(("py-small", "onnx-large"),
                                                (Tier.DEVICE, Tier.CLOUD)))
    assert [s.model for s in stages.calib] == ["py-small", "onnx-large"]
    np.testing.assert_array_equal(stages.eval[0].correct, stages.eval[1].correct)
    np.testing.assert_allclose(stages.eval[0].confidence, stages.eval[1].confidence,
                               rtol=1e-3, atol=1e-4)  # calibrated: the same confidence
