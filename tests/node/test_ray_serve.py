"""The Ray Serve runtime's parts that need no cluster: a model's signature from its graph,
autoscaling settings from the fleet file."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tierlink.models.tensors import TensorDecl
from tierlink.node.ray_serve import _autoscaling, app_name, signature
from tierlink.settings.engine import EngineConfig


def test_a_signature_is_read_from_the_graph(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], [0.0] * 6)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, ["n"])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"]),
                               helper.make_node("ArgMax", ["y"], ["k"], axis=1, keepdims=0)],
                              "g", [x], [y, k], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(path))
    sig = signature(path)
    assert sig.inputs == (TensorDecl("x", "FP32", (-1, 3)),)
    assert sig.outputs == (TensorDecl("y", "FP32", (-1, 2)), TensorDecl("k", "INT64", (-1,)))


def test_autoscaling_follows_the_fleet_file() -> None:
    config = EngineConfig(kind="ray", min_replicas=1, max_replicas=3,
                          target_ongoing_requests=1.5)
    scaling = _autoscaling(config)
    assert (scaling["min_replicas"], scaling["max_replicas"],
            scaling["target_ongoing_requests"]) == (1, 3, 1.5)
    assert app_name("cloud-1", "m") == "tierlink-cloud-1-m"
