"""The deliberately bad model versions: one answers worse, one confidently wrong on one
class, one cannot be loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tierlink.testing.artifacts import degraded_copy, relabeled_copy, unloadable_copy


def tiny_classifier(path: Path) -> Path:
    """x (N, 4) @ W (4, 3) + b: a linear classifier."""
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    b = np.zeros(3, np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_degraded_copy_changes_the_weights_not_the_biases(tmp_path: Path) -> None:
    src = tiny_classifier(tmp_path / "m.onnx")
    dst = degraded_copy(src, tmp_path / "bad.onnx", noise=1.0, seed=3)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    assert not np.allclose(run(src, x), run(dst, x))
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(dst)).graph.initializer}
    assert np.array_equal(weights["b"], np.zeros(3, np.float32))
    assert np.allclose(run(src, x), run(tiny_classifier(tmp_path / "again.onnx"), x))


def test_unloadable_copy_parses_but_no_session_can_be_made(tmp_path: Path) -> None:
    dst = unloadable_copy(tiny_classifier(tmp_path / "m.onnx"), tmp_path / "broken.onnx")
    onnx.load(str(dst))  # a well-formed file
    with pytest.raises(Exception, match="NoSuchOperator"):
        ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])


def test_relabeled_copy_is_wrong_on_one_class_and_just_as_confident(tmp_path: Path) -> None:
    # y's dim must be known for the swap: the tiny classifier declares (N, 3)
    src = tiny_classifier(tmp_path / "good.onnx")
    dst = relabeled_copy(src, tmp_path / "relabeled.onnx", from_class=2, to_class=0)
    x = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    good, bad = run(src, x), run(dst, x)
    was = good.argmax(axis=1)
    assert set(was) == {0, 2}  # what this classifier answers on such inputs
    assert (bad.argmax(axis=1)[was == 2] == 0).all()  # class 2 answered as class 0
    np.testing.assert_array_equal(bad[was != 2], good[was != 2])  # nothing else moves
    np.testing.assert_allclose(np.sort(bad, axis=1), np.sort(good, axis=1))  # as confident
