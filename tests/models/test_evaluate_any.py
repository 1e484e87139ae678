"""Measuring a model of any kind (``models/evaluate.py``, ``models/calibration.py``): the signature, feeding the data,
running in batches, latency (on an injected clock), the fitted temperature, the cascade
curve."""

from __future__ import annotations

import math
from dataclasses import asdict
from types import MappingProxyType

import numpy as np
import pytest
from onnx import TensorProto, helper

import byo_support as byo
from tierlink.errors import ImportRefused
from tierlink.models import evaluate as measure
from tierlink.models.calibration import calibration_error, kind_temperature
from tierlink.models.kinds import Classification, Multilabel, Regression, softmax
from tierlink.models.onnx import open_session
from tierlink.models.task import TaskSpec
from tierlink.models.tensors import TensorDecl

CLS = TaskSpec("t", "classification", (TensorDecl("x", "FP32", (-1, 4)),))


@pytest.fixture
def session(tmp_path):
    return open_session(byo.classifier(tmp_path / "cls.onnx")).session


def test_signature_reads_names_datatypes_and_dynamic_sizes(tmp_path):
    s = open_session(byo.detector(tmp_path / "det.onnx")).session
    inputs, outputs = measure.signature(s)
    assert inputs == (TensorDecl("x", "FP32", (-1, 10)),)
    assert outputs == (TensorDecl("boxes", "FP32", (-1, 2, 4)),
                       TensorDecl("scores", "FP32", (-1, 2)))


def test_a_tensor_type_the_protocol_cannot_carry_is_refused(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])], "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["N"])])
    path = tmp_path / "s.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                       ir_version=8).SerializeToString())
    with pytest.raises(ImportRefused, match=r"'text' has type tensor\(string\)"):
        measure.signature(open_session(path).session)


def test_feed_casts_integers_to_the_models_floats():
    fed = measure.feed({"x": np.arange(8, dtype=np.int64).reshape(2, 4)}, CLS.inputs)
    assert fed["x"].dtype == np.float32 and fed["x"].flags.c_contiguous
    ints = (TensorDecl("tokens", "INT64", (-1, 2)),)
    assert measure.feed({"tokens": np.ones((3, 2), np.int32)}, ints)["tokens"].dtype == np.int64


def test_feed_refuses_floats_for_an_integer_input():
    with pytest.raises(ImportRefused, match="data for input 'tokens' is float32; the model "
                                            "takes INT64"):
        measure.feed({"tokens": np.ones((3, 2), np.float32)},
                     (TensorDecl("tokens", "INT64", (-1, 2)),))


def test_run_goes_batch_by_batch_and_joins_the_outputs(session):
    x, _ = byo.classification_data(n=23)
    seen: list[int] = []
    out = measure.run(session, {"x": x}, batch=5, progress=seen.append)
    assert seen == [5, 5, 5, 5, 3]
    np.testing.assert_allclose(out["logits"], x @ byo.W_CLS + byo.B_CLS, rtol=1e-5, atol=1e-6)


def test_a_model_that_fails_on_the_data_is_refused(session):
    with pytest.raises(ImportRefused, match="the model fails on the data"):
        measure.run(session, {"x": np.zeros((2, 4), np.float64)})  # not fed: wrong type


def test_latency_on_an_injected_clock(session):
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # every reading is one millisecond later
        return now[0]

    x, _ = byo.classification_data(n=5)
    lat = measure.latency(session, {"x": x}, budget_s=0.1, clock=clock)
    # each timed call spans two readings: 1 ms; batch 32 is per sample
    assert lat == {"batch1_p50": pytest.approx(1.0), "batch1_p95": pytest.approx(1.0),
                   "batch32_per_sample": pytest.approx(1.0 / 32)}


def test_fit_temperature_recovers_the_temperature_the_labels_were_drawn_at():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3.0, size=(4000, 4)).astype(np.float32)
    p = softmax(logits, 2.5).astype(np.float64)
    y = np.array([rng.choice(4, p=row / row.sum()) for row in p])
    t, before, after = kind_temperature(Classification(), {"l": logits}, y, CLS)
    assert t == pytest.approx(2.5, rel=0.1) and after < before


def test_fit_temperature_for_multilabel_uses_binary_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(scale=3.0, size=(3000, 3)).astype(np.float32)
    y = (rng.random((3000, 3)) < 1 / (1 + np.exp(-logits / 0.5))).astype(np.int64)
    t, before, after = kind_temperature(
        Multilabel(), {"l": logits}, y, TaskSpec("t", "multilabel", CLS.inputs))
    assert t == pytest.approx(0.5, rel=0.1) and after < before


def test_no_temperature_for_a_kind_without_logits():
    t, before, after = kind_temperature(
        Regression(), {"v": np.zeros(3, np.float32)}, np.zeros(3),
        TaskSpec("t", "regression", CLS.inputs, MappingProxyType({})))
    assert t == 1.0 and math.isnan(before) and math.isnan(after)


def test_cascade_curve_by_hand():
    conf = np.array([0.5, 0.6, 0.9, 1.0])
    correct = np.array([False, True, True, True])
    curve = {p["threshold"]: p for p in map(asdict, measure.cascade_points(
        conf, correct, measure.FINE_THRESHOLDS))}
    assert list(curve) == list(measure.FINE_THRESHOLDS)
    assert curve[0.5] == {"threshold": 0.5, "answered_share": 1.0, "answered_accuracy": 0.75}
    assert curve[0.6] == {"threshold": 0.6, "answered_share": 0.75, "answered_accuracy": 1.0}
    assert curve[0.999]["answered_share"] == 0.25
    none = measure.cascade_points(np.array([0.5]), np.array([False]), measure.FINE_THRESHOLDS)
    assert asdict(none[-1]) == {"threshold": 0.999, "answered_share": 0.0, "answered_accuracy": 1.0}


def test_the_ece_of_confidences_is_the_ece_of_their_logits():
    from tierlink.models.calibration import ece
    from tierlink.models.kinds import softmax

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(500, 4)) * 3
    labels = rng.integers(0, 4, 500)
    probs = softmax(logits, 1.3)
    assert calibration_error(probs.max(axis=1), probs.argmax(axis=1) == labels) == \
        pytest.approx(ece(logits, labels, 1.3), abs=1e-4)
