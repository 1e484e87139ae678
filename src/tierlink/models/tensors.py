"""One tensor declaration for every model, task and wire description.

A :class:`TensorDecl` is an input or output: its name, its Open Inference Protocol datatype
and its shape, ``-1`` for a dynamic size (the batch first). Cards, task declarations, a
node's model metadata and runtime input checks all use it. Pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierlink.errors import ConfigError

DATATYPES = ("FP32", "FP64", "FP16", "INT64", "INT32", "INT8", "UINT8", "BOOL")
# ONNX Runtime's type names -> OIP datatypes; OIP datatypes -> numpy.
ORT_TYPES = {"tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(float16)": "FP16",
             "tensor(int64)": "INT64", "tensor(int32)": "INT32", "tensor(int8)": "INT8",
             "tensor(uint8)": "UINT8", "tensor(bool)": "BOOL"}
NP_TYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64,
            "INT32": np.int32, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}


@dataclass(frozen=True, slots=True)
class TensorDecl:
    """One input or output; ``-1`` is any size (the batch first)."""

    name: str
    datatype: str  # OIP datatype, e.g. "FP32"
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """The OIP metadata form: ``{name, datatype, shape}``."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def matches(self, other: TensorDecl) -> bool:
        """Same name, datatype and rank; fixed sizes agree where both are fixed."""
        return (self.name == other.name and self.datatype == other.datatype
                and len(self.shape) == len(other.shape)
                and all(a == b or -1 in (a, b) for a, b in zip(self.shape, other.shape,
                                                                strict=True)))

    def describe(self) -> str:
        return f"{self.name} {self.datatype}{list(self.shape)}"


def from_ort(arg: Any) -> TensorDecl:
    """The declaration of an ONNX Runtime ``NodeArg`` (a symbolic or missing size is -1; a
    type the protocol cannot carry keeps ONNX Runtime's name)."""
    shape = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)
    return TensorDecl(arg.name, ORT_TYPES.get(arg.type, arg.type), shape)


def datatype_of(dtype: Any) -> str:
    """The OIP datatype of a numpy dtype; ``ConfigError`` for one the protocol cannot carry
    here."""
    for name, np_type in NP_TYPES.items():
        if np.dtype(dtype) == np.dtype(np_type):
            return name
    raise ConfigError(f"numpy {np.dtype(dtype)} has no Open Inference Protocol datatype here",
                      hint=f"use one of {', '.join(DATATYPES)}")


def tensor_decl(raw: Any, where: str) -> TensorDecl:
    """Parse ``{name, datatype, shape}`` (a fleet file's, a card's); ``ConfigError`` naming
    ``where`` when it is malformed."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping {{name, datatype, shape}}, got {raw!r}")
    unknown = sorted(set(raw) - {"name", "datatype", "shape"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}",
                          hint="a tensor is declared by name, datatype and shape")
    try:
        name, datatype = str(raw["name"]), str(raw.get("datatype", "FP32")).upper()
        shape = tuple(int(d) for d in raw["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}",
                          hint="e.g. {name: tokens, datatype: INT64, shape: [-1, 256]}") from exc
    if datatype not in DATATYPES:
        raise ConfigError(f"{where}.datatype {datatype!r} is not an OIP datatype",
                          hint=f"one of {', '.join(DATATYPES)}")
    if any(d == 0 or d < -1 for d in shape):
        raise ConfigError(f"{where}.shape {list(shape)}: sizes are positive, or -1 for any")
    return TensorDecl(name, datatype, shape)
