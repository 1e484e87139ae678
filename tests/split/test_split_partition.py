"""Partitioning: the listed cuts are exactly the single-tensor ones, and head -> tail is the
whole model bit for bit (zoo models at every cut; a handmade residual graph)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tierlink.errors import SplitError
from tierlink.models.onnx import ort_session
from tierlink.split.partition import CutPoint, cut_points, split_model
from tierlink.zoo import ensure_zoo

ZOO_MODELS = ("fmnist-small", "fmnist-medium", "fmnist-large")


@pytest.fixture(scope="module")
def zoo():
    return ensure_zoo(profile="test", progress=False)  # built once per machine, then cached


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(7).random((7, 1, 28, 28), dtype=np.float32)


def _head_tail(model: Path, tensor: str, tmp: Path):
    head, tail = split_model(model, tensor, tmp / "head.onnx", tmp / "tail.onnx")
    return ort_session(head), ort_session(tail)


def _run_split(head, tail, feed: dict[str, np.ndarray]) -> np.ndarray:
    features = head.run(None, feed)
    assert len(features) == 1  # the head has exactly one output: the cut tensor
    return tail.run(None, {tail.get_inputs()[0].name: features[0]})[0]


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_head_then_tail_is_bit_exact_at_every_cut(zoo, images, name, tmp_path):
    path = zoo.path(name)
    whole = ort_session(path)
    cuts = cut_points(path)
    assert [c.index for c in cuts] == list(range(len(cuts)))
    assert cuts[0].tensor == "input" and cuts[0].after_node == ""
    assert len(cuts) >= 12
    for cut in cuts:
        head, tail = _head_tail(path, cut.tensor, tmp_path)
        assert tail.get_inputs()[0].name == cut.tensor
        for batch in (1, 7):
            feed = {"input": images[:batch]}
            expected = whole.run(None, feed)[0]
            got = _run_split(head, tail, feed)
            assert np.array_equal(got, expected), f"{name} cut {cut.index} ({cut.tensor})"


def test_zoo_cut_metadata(zoo):
    cuts = {c.tensor: c for c in cut_points(onnx.load(str(zoo.path("fmnist-small"))))}
    pool = cuts["/4/MaxPool_output_0"]
    assert pool.shape == (-1, 16, 14, 14)
    assert pool.dtype == "FP32"
    assert pool.bytes_per_sample == 16 * 14 * 14 * 4
    assert pool.after_node == "/4/MaxPool"
    assert "logits" not in cuts  # the graph output is not a cut: that is running it all


def _residual_model() -> onnx.ModelProto:
    """x -> MatMul -> h1 -> Relu -> r -> MatMul -> m; s = r + m; t = s * c; y = Relu(t).
    ``m`` is made while ``r`` is still needed, so no cut sits right after it. The Constant
    ``c`` comes first and must never count as crossing."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(4, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const",
                         value=numpy_helper.from_array(np.float32(0.5).reshape(1), "cv")),
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["r"], name="relu1"),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="mm2"),
        helper.make_node("Add", ["r", "m"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "c"], ["t"], name="mul"),
        helper.make_node("Relu", ["t"], ["y"], name="relu2"),
    ]
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_residual_graph_lists_only_single_tensor_cuts():
    cuts = cut_points(_residual_model())
    assert [c.tensor for c in cuts] == ["x", "h1", "r", "s", "t"]
    assert "m" not in {c.tensor for c in cuts}  # r and m both cross there
    assert cuts[1] == CutPoint(1, "h1", "mm1", (-1, 8), "FP32", 32)
    assert cuts[0].after_node == ""


def test_residual_graph_split_is_exact_and_rejects_the_branch(tmp_path):
    path = tmp_path / "residual.onnx"
    onnx.save(_residual_model(), str(path))
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    expected = ort_session(path).run(None, {"x": x})[0]
    for cut in cut_points(path):
        head, tail = _head_tail(path, cut.tensor, tmp_path)
        assert np.array_equal(_run_split(head, tail, {"x": x}), expected), cut.tensor
        assert np.array_equal(_run_split(head, tail, {"x": x[:1]}), expected[:1])
    with pytest.raises(SplitError, match="not a single-tensor cut"):
        split_model(path, "m", tmp_path / "h.onnx", tmp_path / "t.onnx")
    with pytest.raises(SplitError, match="'nope'"):
        split_model(path, "nope", tmp_path / "h.onnx", tmp_path / "t.onnx")


def test_split_keeps_the_batch_dimension_dynamic(tmp_path):
    path = tmp_path / "residual.onnx"
    onnx.save(_residual_model(), str(path))
    head, tail = split_model(path, "r", tmp_path / "h.onnx", tmp_path / "t.onnx")
    for part, value in ((head, onnx.load(str(head)).graph.output[0]),
                        (tail, onnx.load(str(tail)).graph.input[0])):
        dims = value.type.tensor_type.shape.dim
        assert value.name == "r", part
        assert dims[0].dim_param == "batch" and dims[1].dim_value == 8


def test_unsorted_graph_and_unreadable_file_are_split_errors(tmp_path):
    model = _residual_model()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([nodes[0], nodes[2], nodes[1], *nodes[3:]])  # relu before mm1
    with pytest.raises(SplitError, match="topologically"):
        cut_points(model)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(SplitError, match="cannot read"):
        cut_points(bad)
