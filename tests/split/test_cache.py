import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tierlink.split.cache import cached_cuts, cached_split, split_dir
from tierlink.split.partition import cut_points


@pytest.fixture
def tiny_model(tmp_path):
    """x -> MatMul -> Relu -> MatMul -> y, saved in a directory of the test's own."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(4, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(8, 3)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "models" / "tiny.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    return path


def test_cuts_are_made_once_and_kept_beside_the_model(tiny_model):
    tensor = next(c.tensor for c in cut_points(tiny_model) if c.index > 0)
    head, tail = cached_split(tiny_model, tensor)
    assert head.parent == split_dir(tiny_model) and head.exists() and tail.exists()
    made = head.stat().st_mtime_ns
    assert cached_split(tiny_model, tensor) == (head, tail)
    assert head.stat().st_mtime_ns == made  # not cut again
    assert not [p for p in head.parent.iterdir() if ".tmp-" in p.name]


def test_a_replaced_model_gets_new_cuts(tiny_model):
    tensor = next(c.tensor for c in cut_points(tiny_model) if c.index > 0)
    before = cached_split(tiny_model, tensor)[0].parent
    st = tiny_model.stat()
    os.utime(tiny_model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert cached_split(tiny_model, tensor)[0].parent != before


def test_cut_points_are_found_once(tiny_model):
    cuts = cached_cuts(tiny_model)
    assert cuts == {c.tensor for c in cut_points(tiny_model) if c.index > 0}
    assert (split_dir(tiny_model) / "cuts.json").exists()
    assert cached_cuts(tiny_model) == cuts


def test_an_unwritable_model_directory_falls_back(tiny_model, tmp_path, monkeypatch):
    from tierlink.split import cache

    tensor = next(c.tensor for c in cut_points(tiny_model) if c.index > 0)

    def refuse(model_path):
        raise PermissionError("read-only")

    real = cache._made
    monkeypatch.setattr(cache, "_made", lambda d, m, t: refuse(m) if d == split_dir(m)
                        else real(d, m, t))
    head, _ = cached_split(tiny_model, tensor, fallback_dir=tmp_path / "fb")
    assert head.parent == tmp_path / "fb"
