"""Bad model versions on purpose, for the fault suite and the rollout tests.

* :func:`degraded_copy`: the same graph with Gaussian noise added to every weight tensor — it loads and answers at the usual speed, only worse (a version that "loses
  accuracy"; how much depends on ``noise``).
* :func:`unloadable_copy`: a well-formed ONNX file whose graph uses an operator no runtime
  has — signing and hashing accept it, ONNX Runtime refuses to create a session (a version
  that "crashes on load").

Both write a new file and leave the original alone; ``onnx`` is imported when called.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def degraded_copy(src: Path | str, dst: Path | str, noise: float = 1.0, seed: int = 0) -> Path:
    """``src`` with ``noise`` x (each tensor's std) Gaussian noise on every floating-point
    initializer of rank >= 2 (the weights; biases and shapes stay)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    rng = np.random.default_rng(seed)
    for tensor in model.graph.initializer:
        weights = numpy_helper.to_array(tensor)
        if weights.ndim < 2 or weights.dtype.kind != "f":
            continue
        noisy = weights + rng.normal(0.0, noise * float(weights.std()), weights.shape)
        tensor.CopyFrom(numpy_helper.from_array(noisy.astype(weights.dtype), tensor.name))
    onnx.save(model, str(dst))
    return Path(dst)


def unloadable_copy(src: Path | str, dst: Path | str) -> Path:
    """``src`` with one more node of an operator that exists in no domain ONNX Runtime
    knows, feeding nothing: the file parses, a session cannot be created."""
    import onnx
    from onnx import helper

    model = onnx.load(str(src))
    first = model.graph.input[0].name
    model.graph.node.append(helper.make_node("NoSuchOperator", [first], ["tierlink_broken"],
                                             domain="tierlink.broken"))
    model.opset_import.append(helper.make_opsetid("tierlink.broken", 1))
    onnx.save(model, str(dst))
    return Path(dst)
