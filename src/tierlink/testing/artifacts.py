"""Bad model versions on purpose, for the fault suite and the rollout tests.

* :func:`degraded_copy`: the same graph with Gaussian noise added to every weight tensor — it loads and answers at the usual speed, only worse (a version that "loses
  accuracy"; how much depends on ``noise``).
* :func:`relabeled_copy`: the same graph answering ``to_class`` wherever it would have
  answered ``from_class``, just as confident (the two logits swap places on those inputs): a
  version confidently wrong on one class, which no confidence statistic sees.
* :func:`unloadable_copy`: a well-formed ONNX file whose graph uses an operator no runtime
  has — signing and hashing accept it, ONNX Runtime refuses to create a session (a version
  that "crashes on load").

Each writes a new file and leave the original alone; ``onnx`` is imported when called.
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


def relabeled_copy(src: Path | str, dst: Path | str, from_class: int, to_class: int) -> Path:
    """``src`` whose first output (the logits) has columns ``from_class`` and ``to_class``
    swapped on the rows whose argmax is ``from_class`` — nowhere else (see the module doc)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(src))
    graph = model.graph
    out = graph.output[0]
    logits, renamed = out.name, f"{out.name}__before_relabel"
    for node in graph.node:
        node.output[:] = [renamed if o == logits else o for o in node.output]
    n_classes = out.type.tensor_type.shape.dim[1].dim_value
    perm = list(range(n_classes))
    perm[from_class], perm[to_class] = to_class, from_class
    graph.initializer.extend([
        helper.make_tensor("relabel_perm", TensorProto.INT64, [n_classes], perm),
        helper.make_tensor("relabel_from", TensorProto.INT64, [1], [from_class])])
    graph.node.extend([
        helper.make_node("ArgMax", [renamed], ["relabel_argmax"], axis=1, keepdims=1),
        helper.make_node("Equal", ["relabel_argmax", "relabel_from"], ["relabel_is_from"]),
        helper.make_node("Gather", [renamed, "relabel_perm"], ["relabel_swapped"], axis=1),
        helper.make_node("Where", ["relabel_is_from", "relabel_swapped", renamed], [logits])])
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
