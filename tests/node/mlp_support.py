"""A small real ONNX model for node tests: a two-layer classifier on the zoo's input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(path: Path, hidden: int = 1024, seed: int = 0) -> Path:
    """A two-layer classifier on the zoo's input with random weights: enough work per row
    (~1 ms) that requests pile up behind a running one."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.05, (784, hidden)).astype(np.float32)
    w2 = rng.normal(0, 0.05, (hidden, 10)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"], axis=1),
         helper.make_node("MatMul", ["flat", "w1"], ["h"]),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["logits"])],
        "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
