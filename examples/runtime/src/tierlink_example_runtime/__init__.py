"""A model runtime for PyTorch's own deployment format: a program made by ``torch.export``
and saved with ``torch.export.save`` (a ``.pt2`` file), served with no ONNX export.

tierlink asks a runtime for four things (:class:`tierlink.models.runtime.ModelRuntime`):
its model's ``info`` (from the card), its ``inputs`` and ``outputs`` (names, OIP datatypes,
shapes with -1 for a free dimension) and one blocking ``infer(inputs) -> outputs`` on numpy
arrays, which the node calls on its worker threads, never on its event loop. The factory,
registered under the ``tierlink.runtimes`` entry points as format ``pt2``, makes one from a
:class:`tierlink.models.runtimes.LoadSpec` (the card, the file beside it, the threads).

An exported program knows its signature: the inputs' shapes and dtypes (a dimension
exported as dynamic, such as the batch, reads -1); its outputs are named ``output`` (one)
or ``output_0``, ``output_1``, ... in the order ``forward`` returns them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tierlink.errors import ModelError
from tierlink.models.runtime import ModelInfo, validate_inputs
from tierlink.models.runtimes import LoadSpec
from tierlink.models.tensors import TensorDecl, datatype_of

FORMAT = "pt2"


class ExportedProgramModel:
    """One ``.pt2`` program, run by PyTorch on the CPU."""

    platform = "pytorch"
    provider = "torch-cpu"

    def __init__(self, path: Path, info: ModelInfo, threads: int = 1) -> None:
        try:
            program = torch.export.load(str(path))
        except Exception as exc:  # not a program: say so, naming the file
            raise ModelError(f"{path} is not a torch.export program: {exc}",
                             hint="save it with torch.export.save(torch.export.export(...))"
                             ) from exc
        torch.set_num_threads(threads)  # the process's: a node gives each model one thread
        self.info = info
        self.inputs = _inputs(program)
        self.outputs = _outputs(program)
        self._module = program.module()

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = validate_inputs(self.info.name, self.inputs, inputs)
        with torch.inference_mode():
            out = self._module(*(torch.from_numpy(feed[d.name]) for d in self.inputs))
        values = out if isinstance(out, tuple | list) else (out,)
        return {d.name: v.numpy() for d, v in zip(self.outputs, values, strict=True)}


def load(spec: LoadSpec) -> ExportedProgramModel:
    """The ``pt2`` format's factory: the program the card names, beside it."""
    card = spec.read_card()
    return ExportedProgramModel(spec.model_file or spec.directory / card.file,
                                ModelInfo.of(card), spec.threads)


def _inputs(program: Any) -> tuple[TensorDecl, ...]:
    names = set(program.graph_signature.user_inputs)
    return tuple(_decl(node.name, node.meta["val"]) for node in program.graph.nodes
                 if node.op == "placeholder" and node.name in names)


def _outputs(program: Any) -> tuple[TensorDecl, ...]:
    (values,) = next(n for n in program.graph.nodes if n.op == "output").args
    tensors = [v.meta["val"] for v in values]
    names = ["output"] if len(tensors) == 1 else [f"output_{i}" for i in range(len(tensors))]
    return tuple(_decl(n, t) for n, t in zip(names, tensors, strict=True))


def _decl(name: str, tensor: Any) -> TensorDecl:
    """A tensor's declaration: a symbolic (exported as dynamic) dimension reads -1."""
    shape = tuple(d if isinstance(d, int) else -1 for d in tensor.shape)
    dtype = torch.empty(0, dtype=tensor.dtype).numpy().dtype
    return TensorDecl(name, datatype_of(dtype), shape)
