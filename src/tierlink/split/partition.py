"""Cut an ONNX model in two at a single tensor: the head (graph input -> tensor) runs on one
node, the tail (tensor -> graph outputs) on another, and only that tensor travels between them.

A *cut* is a position in the graph's (topological) node order where exactly one tensor
computed before it is still needed after it. Tensors that do not depend on a graph input —
initializers, ``Constant`` nodes and what is computed from them alone — never count as
crossing: each side gets its own copy. Positions with two or more crossing tensors (inside a
residual block, between the branches of an inception module) are not cuts.

:func:`cut_points` lists the cuts in topological order. Cut 0 is the trivial cut right after
the graph input (the head is the identity, the tail the whole model: "send the raw input,
perhaps compressed") when the model has a single input; the graph outputs themselves are not
listed (cutting there is running the whole model locally). :func:`split_model` writes the
head and the tail of one cut; running the head then the tail equals the whole model bit for
bit (same kernels on the same values — see ``tests/split/test_partition.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierlink.errors import SplitError

if TYPE_CHECKING:
    import onnx

# ONNX TensorProto element types -> Open Inference Protocol datatype names (and item sizes).
_OIP_TYPES: dict[int, tuple[str, int]] = {
    1: ("FP32", 4), 2: ("UINT8", 1), 3: ("INT8", 1), 4: ("UINT16", 2), 5: ("INT16", 2),
    6: ("INT32", 4), 7: ("INT64", 8), 8: ("BYTES", -1), 9: ("BOOL", 1), 10: ("FP16", 2),
    11: ("FP64", 8), 12: ("UINT32", 4), 13: ("UINT64", 8), 16: ("BF16", 2),
}
BATCH_DIM = "batch"  # the dim_param given to the cut tensor's first dimension


@dataclass(frozen=True, slots=True)
class CutPoint:
    """One single-tensor cut of a model.

    ``index``: the cut's place in topological order (0 = right after the graph input);
    ``tensor``: the one tensor crossing the cut (the head's output, the tail's input);
    ``after_node``: the last node of the head ("" for cut 0); ``shape``: the tensor's shape,
    -1 for the batch and any other dynamic dimension; ``dtype``: its OIP datatype name;
    ``bytes_per_sample``: bytes of one sample in that dtype (4 per element for FP32), -1 when
    a non-batch dimension is dynamic.
    """

    index: int
    tensor: str
    after_node: str
    shape: tuple[int, ...]
    dtype: str
    bytes_per_sample: int

    @property
    def kb_per_sample(self) -> float:
        """``bytes_per_sample`` in KiB (negative when unknown)."""
        return self.bytes_per_sample / 1024.0

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "tensor": self.tensor, "after_node": self.after_node,
                "shape": list(self.shape), "dtype": self.dtype,
                "bytes_per_sample": self.bytes_per_sample}


@dataclass(frozen=True, slots=True)
class _Graph:
    """The data flow of a graph's top level. Positions index ``nodes``; graph inputs are
    produced at -1 and graph outputs are used at ``len(nodes)``."""

    nodes: tuple[Any, ...]        # onnx.NodeProto, in the graph's (topological) order
    inputs: tuple[str, ...]       # graph inputs that are not initializers
    outputs: tuple[str, ...]
    live: frozenset[str]          # tensors that depend on a graph input
    producer: dict[str, int]
    last_use: dict[str, int]

    def crossing(self, k: int) -> list[str]:
        """Live tensors made before position ``k`` (after the first k nodes) and used at or
        after it."""
        return [t for t in self.live
                if self.producer[t] < k <= self.last_use.get(t, -2)]


def cut_points(model: Path | onnx.ModelProto) -> list[CutPoint]:
    """Every valid single-tensor cut of ``model`` (a path or a loaded model), in topological
    order. Raises ``SplitError`` when the model cannot be read or is not topologically
    sorted."""
    proto = _load(model)
    return _cuts(proto, _analyse(proto.graph))


def split_model(model: Path, tensor: str, head_path: Path,
                tail_path: Path) -> tuple[Path, Path]:
    """Write the head (graph inputs -> ``tensor``, its only output) to ``head_path`` and the
    tail (``tensor``, its only input, same name -> the original outputs) to ``tail_path``.
    The cut tensor's first dimension is the dynamic ``batch``. Raises ``SplitError`` when
    ``tensor`` is not one of :func:`cut_points`."""
    proto = _load(model)
    graph = _analyse(proto.graph)
    cuts = {c.tensor: c for c in _cuts(proto, graph)}
    if tensor not in cuts:
        raise SplitError(f"{tensor!r} is not a single-tensor cut of {_label(model)}; valid "
                         f"cuts: {', '.join(cuts) or 'none'}", tensor=tensor)
    info = _cut_info(proto, tensor)
    real_inputs = [v for v in proto.graph.input if v.name in graph.inputs]
    head_nodes = _slice(graph.nodes, [tensor], stop=set(graph.inputs))
    tail_nodes = _slice(graph.nodes, list(graph.outputs), stop={tensor})
    head = _submodel(proto, head_nodes, real_inputs, [info], part="head", tensor=tensor)
    tail = _submodel(proto, tail_nodes, [info], list(proto.graph.output), part="tail",
                     tensor=tensor)
    return _save(head, Path(head_path)), _save(tail, Path(tail_path))


def _load(model: Path | onnx.ModelProto) -> onnx.ModelProto:
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model))
    except Exception as exc:  # onnx raises protobuf / OS errors of its own
        raise SplitError(f"cannot read ONNX model {model}: {exc}",
                         hint="pass a path to a valid .onnx file") from exc


def _label(model: Path | Any) -> str:
    return str(model) if isinstance(model, (str, Path)) else "the model"


def node_inputs(node: Any) -> list[str]:
    """The tensors ``node`` reads: its inputs plus the outer-scope names its subgraphs
    (``If``/``Loop``/``Scan`` bodies) refer to."""
    names = [name for name in node.input if name]
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            names.extend(_outer_refs(sub))
    return names


def _outer_refs(graph: Any) -> list[str]:
    inner = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    refs: list[str] = []
    for node in graph.node:
        refs.extend(n for n in node_inputs(node) if n not in inner)
        inner.update(node.output)
    return refs


def _analyse(graph: Any) -> _Graph:
    initializers = {i.name for i in graph.initializer} | {
        s.values.name for s in graph.sparse_initializer}
    inputs = tuple(v.name for v in graph.input if v.name not in initializers)
    made_at = {out: pos for pos, node in enumerate(graph.node) for out in node.output if out}
    producer = {name: -1 for name in inputs}
    live, last_use = set(inputs), {}
    for pos, node in enumerate(graph.node):
        reads = node_inputs(node)
        for name in reads:
            if made_at.get(name, -1) >= pos:
                raise SplitError(f"node {node.name or pos} reads {name!r} before it is made: "
                                 "the graph is not topologically sorted",
                                 hint="re-export the model or sort it with onnx tools")
            last_use[name] = pos
        if any(name in live for name in reads):
            outs = [o for o in node.output if o]
            live.update(outs)
            producer.update({o: pos for o in outs})
    outputs = tuple(v.name for v in graph.output)
    last_use.update({name: len(graph.node) for name in outputs})
    return _Graph(tuple(graph.node), inputs, outputs, frozenset(live), producer, last_use)


def _cuts(proto: Any, graph: _Graph) -> list[CutPoint]:
    """The earliest position of each tensor that alone crosses a cut."""
    infos = _value_infos(proto)
    found: dict[str, int] = {}
    for k in range(len(graph.nodes)):
        crossing = graph.crossing(k)
        if len(crossing) == 1 and crossing[0] not in graph.outputs:
            found.setdefault(crossing[0], k)
    cuts = []
    for index, (tensor, k) in enumerate(sorted(found.items(), key=lambda item: item[1])):
        after = graph.nodes[k - 1] if k > 0 else None
        after_name = "" if after is None else (after.name or after.output[0])
        cuts.append(_cut_point(index, tensor, after_name, infos.get(tensor)))
    return cuts


def _value_infos(proto: Any) -> dict[str, Any]:
    """Tensor name -> ValueInfoProto, with shapes from ONNX shape inference when it works."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError):
        # Best effort: tensors without an inferred shape are reported as unknown.
        inferred = proto
    g = inferred.graph
    return {v.name: v for v in [*g.value_info, *g.input, *g.output]}


def _cut_point(index: int, tensor: str, after: str, info: Any) -> CutPoint:
    elem = info.type.tensor_type.elem_type if info is not None else 0
    dtype, itemsize = _OIP_TYPES.get(elem, ("UNKNOWN", -1))
    shape = _shape(info)
    per_sample = -1
    if shape and itemsize > 0 and all(d >= 0 for d in shape[1:]):
        per_sample = itemsize
        for d in shape[1:]:
            per_sample *= d
    return CutPoint(index, tensor, after, shape, dtype, per_sample)


def _shape(info: Any) -> tuple[int, ...]:
    """Dims of ``info`` with -1 for the batch (first) and every symbolic or unknown dim."""
    if info is None or not info.type.tensor_type.HasField("shape"):
        return ()
    dims = info.type.tensor_type.shape.dim
    return tuple(-1 if i == 0 or not d.HasField("dim_value") else int(d.dim_value)
                 for i, d in enumerate(dims))


def _cut_info(proto: Any, tensor: str) -> Any:
    """The cut tensor's ValueInfoProto with a dynamic first (batch) dimension."""
    import onnx

    info = _value_infos(proto).get(tensor)
    if info is None or not info.type.tensor_type.elem_type:
        raise SplitError(f"the type of {tensor!r} is unknown (shape inference failed)",
                         hint="the model needs inferable types to be split")
    out = onnx.ValueInfoProto()
    out.CopyFrom(info)
    out.name = tensor
    dims = out.type.tensor_type.shape.dim
    if out.type.tensor_type.HasField("shape") and len(dims) > 0:
        dims[0].Clear()
        dims[0].dim_param = BATCH_DIM
    return out


def _slice(nodes: Sequence[Any], targets: Iterable[str], stop: set[str]) -> list[Any]:
    """The nodes needed to compute ``targets`` from ``stop`` (and constants), in order."""
    needed = set(targets) - stop
    kept = []
    for node in reversed(nodes):
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(n for n in node_inputs(node) if n not in stop)
    return kept[::-1]


def _submodel(proto: Any, nodes: list[Any], inputs: list[Any], outputs: list[Any], *,
              part: str, tensor: str) -> Any:
    import onnx

    used = {name for node in nodes for name in node_inputs(node)}
    graph = onnx.helper.make_graph(
        nodes, f"{proto.graph.name or 'model'}-{part}", inputs, outputs,
        initializer=[i for i in proto.graph.initializer if i.name in used],
        sparse_initializer=[s for s in proto.graph.sparse_initializer
                            if s.values.name in used])
    model = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import),
                                   functions=list(proto.functions),
                                   producer_name="tierlink.split")
    model.ir_version = proto.ir_version
    meta = model.metadata_props.add()
    meta.key, meta.value = "tierlink.split", json.dumps({"part": part, "tensor": tensor})
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx.checker.ValidationError and friends
        raise SplitError(f"the {part} of the cut at {tensor!r} is not a valid model: {exc}"
                         ) from exc
    return model


def _save(model: Any, path: Path) -> Path:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        onnx.save(model, str(path))
    except OSError as exc:
        raise SplitError(f"cannot write {path}: {exc}") from exc
    return path
