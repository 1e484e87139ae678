"""A user's own Python model as a runtime (format ``python``): no ONNX needed.

What a user writes is KServe's ``Model`` shape — a class with ``load()`` and ``predict()``::

    class Model:
        inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]  # optional

        def __init__(self, path: Path) -> None:   # the model's files (weights ...)
            self.path = path

        def load(self) -> None:                   # once, before any request
            self.weights = np.load(self.path / "weights.npz")

        def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"logits": inputs["x"] @ self.weights["w"]}

``predict`` returns the outputs its task declares (logits for a classifier), so temperature,
ECE, cascade thresholds and every output kind apply unchanged. The model's source — one
``.py`` file, or a directory holding the module (or a package) and its data files — travels
as one file, ``model.zip`` (:mod:`tierlink.models.package`: the same source has the same
sha256); the card names the class as ``entry: "module:Class"``. A node unpacks it once
beside the zip and runs ``predict`` on its scheduler's worker
threads, never on the event loop. Tools that need a graph (quantisation, split computing,
feature codecs) refuse such a model, saying so.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from tierlink.errors import ImportRefused, ModelError, RuntimeFailure
from tierlink.models.package import pack as pack_files
from tierlink.models.package import unpack
from tierlink.models.runtime import ModelInfo, validate_inputs
from tierlink.models.split_profile import profile_path
from tierlink.models.tensors import TensorDecl, tensor_decl

FORMAT = "python"
DEFAULT_ENTRY = "model:Model"


def pack(source: Path, dest: Path) -> None:
    """Zip a model's source (a ``.py`` file, or a directory's files) into ``dest``."""
    source = Path(source)
    if source.is_file() and source.suffix == ".py":
        files = [(source, source.name)]
    elif source.is_dir():
        files = [(p, p.relative_to(source).as_posix()) for p in sorted(source.rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts]
    else:
        raise ImportRefused(f"{source} is neither a .py file nor a directory",
                            hint="give the module file, or the directory holding it and its "
                                 "data files")
    pack_files(files, dest)


class PythonModel:
    """A user's model class, loaded from ``directory`` and called through ``predict``."""

    platform = "python"
    provider = "python"

    def __init__(self, directory: Path, entry: str, info: ModelInfo,
                 inputs: Sequence[TensorDecl] = (), outputs: Sequence[TensorDecl] = ()) -> None:
        self.directory = Path(directory)
        self.info = info
        self._model = _instance(self.directory, entry)
        declared = getattr(self._model, "inputs", None)
        self.inputs = tuple(inputs) or _declared(declared, entry)
        self.outputs = tuple(outputs)
        try:
            self._model.load()
        except Exception as exc:
            raise ModelError(f"{entry}.load() failed: {type(exc).__name__}: {exc}") from exc

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = validate_inputs(self.info.name, self.inputs, inputs)
        return self.predict(feed)

    def predict(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``predict`` on already valid inputs: its outputs as arrays, checked."""
        try:
            raw = self._model.predict(feed)
        except Exception as exc:
            raise RuntimeFailure(f"{self.info.name} failed: {type(exc).__name__}: {exc}") \
                from exc
        if not isinstance(raw, dict):
            raise RuntimeFailure(f"{self.info.name}.predict returned {type(raw).__name__}, "
                                 "not a dict of output name -> array")
        out = {str(k): np.asarray(v) for k, v in raw.items()}
        missing = [o.name for o in self.outputs if o.name not in out]
        if missing:
            raise RuntimeFailure(f"{self.info.name}.predict gave no {missing}; it gave "
                                 f"{sorted(out)}")
        return {o.name: out[o.name] for o in self.outputs} if self.outputs else out


def load_python(spec: Any) -> PythonModel:
    """The ``python`` format's runtime factory (:mod:`tierlink.models.runtimes`)."""
    card = spec.read_card()
    package = spec.model_file or spec.directory / card.file
    return PythonModel(unpack(package), card.entry or DEFAULT_ENTRY,
                       ModelInfo.of(card, profile_path(spec.card)), card.inputs, card.outputs)


def _instance(directory: Path, entry: str) -> Any:
    module_name, _, class_name = entry.partition(":")
    if not module_name or not class_name:
        raise ModelError(f"entry {entry!r} is not 'module:Class'", hint="e.g. model:Model")
    module = _module(directory, module_name)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ModelError(f"{module_name} has no class {class_name!r}")
    for method in ("load", "predict"):
        if not callable(getattr(cls, method, None)):
            raise ModelError(f"{entry} has no {method}() method",
                             hint="a Python model has load() and predict(inputs) -> outputs")
    try:
        return cls(directory)
    except Exception as exc:
        raise ModelError(f"{entry}({directory}) failed: {type(exc).__name__}: {exc}") from exc


def _module(directory: Path, name: str) -> ModuleType:
    """``name`` imported from ``directory`` (a module file or a package), under a name of
    its own per copy, so two versions of a model live side by side in one process."""
    package = directory / name / "__init__.py"
    path = package if package.is_file() else directory / f"{name}.py"
    if not path.is_file():
        raise ModelError(f"the Python model in {directory} has no module {name!r}",
                         hint=f"ship {name}.py (or a package {name}/) in the model's source")
    unique = f"tierlink_user_models.{directory.name.replace('.', '_').replace('-', '_')}_{name}"
    spec = importlib.util.spec_from_file_location(
        unique, path, submodule_search_locations=[str(path.parent)] if path == package else None)
    if spec is None or spec.loader is None:
        raise ModelError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module  # a package's relative imports find their parent here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[unique]
        raise ModelError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _declared(raw: Any, entry: str) -> tuple[TensorDecl, ...]:
    if raw is None:
        return ()
    try:
        return tuple(d if isinstance(d, TensorDecl) else tensor_decl(d, f"{entry}.inputs[{i}]")
                     for i, d in enumerate(raw))
    except TypeError as exc:
        raise ModelError(f"{entry}.inputs is not a list of {{name, datatype, shape}}") from exc
