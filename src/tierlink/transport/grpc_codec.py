"""The Open Inference Protocol over gRPC (KServe's ``inference.GRPCInferenceService``): its
messages to and from what the REST codec (:mod:`tierlink.transport.oip`) decodes, so both
APIs answer alike.

Tensors arrive as ``raw_input_contents`` (binary, in input order) or as typed ``contents``;
either way they are checked as a REST body's are (the same ``TensorError``). Answers travel
as ``raw_output_contents``, as Triton answers. Parameters are the protocol's typed
``InferParameter`` values; a tierlink parameter that is not a scalar travels as JSON text,
as over REST (:func:`oip.pack_param`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tierlink.errors import InvalidRequest, TensorError
from tierlink.transport import oip
from tierlink.transport.proto import messages

__all__ = ["METHODS", "SERVICE", "decode_request", "decode_response", "encode_request",
           "encode_response", "method_types", "params_from", "params_into"]

SERVICE = "inference.GRPCInferenceService"
METHODS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
           "ModelInfer")


def method_types(method: str) -> tuple[Any, Any]:
    """A method's request and response message classes (``ModelInfer``: ``ModelInferRequest``,
    ``ModelInferResponse``)."""
    pb = messages()
    return getattr(pb, f"{method}Request"), getattr(pb, f"{method}Response")

# Typed contents by datatype: the field that carries it.
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
             "BYTES": "bytes_contents"}


def params_from(entries: Mapping[str, Any]) -> dict[str, Any]:
    """A parameters map as plain values."""
    out: dict[str, Any] = {}
    for key, param in entries.items():
        which = param.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidRequest(f"parameter {key!r} has no value")
        out[key] = getattr(param, which)
    return out


def params_into(target: Any, params: Mapping[str, Any]) -> None:
    """``params`` written into a message's parameters map."""
    for key, value in params.items():
        value = oip.pack_param(value.item() if isinstance(value, np.generic) else value)
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = value


def decode_request(msg: Any) -> oip.InferRequestData:
    """A ``ModelInferRequest`` as the REST codec's request (binary answers by default)."""
    if not msg.inputs:
        raise InvalidRequest("request has no inputs: send at least one input tensor")
    raw = list(msg.raw_input_contents)
    if raw and len(raw) != len(msg.inputs):
        raise InvalidRequest(f"raw_input_contents holds {len(raw)} tensors but the request "
                             f"declares {len(msg.inputs)} inputs; send one for each")
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(msg.inputs):
        if tensor.name in inputs:
            raise InvalidRequest(f"input {tensor.name!r} appears twice")
        inputs[tensor.name] = _tensor(i, tensor, raw[i] if raw else None)
    params = params_from(msg.parameters)
    params.pop("binary_data_output", None)  # a REST switch: gRPC answers are binary
    outputs = [oip.RequestedOutput(o.name, True) for o in msg.outputs]
    return oip.InferRequestData(msg.id or None, inputs, params, outputs, True)


def _tensor(index: int, tensor: Any, raw: bytes | None) -> np.ndarray:
    if raw is None:
        field = _CONTENTS.get(tensor.datatype)
        if field is None:
            raise TensorError(f"input {tensor.name!r}: unknown datatype {tensor.datatype!r}; "
                              f"expected one of {', '.join(oip.DATATYPES)}")
        values = list(getattr(tensor.contents, field))
        if tensor.datatype == "BYTES":
            values = [v.decode("utf-8", "replace") for v in values]
        return oip.tensor_from("input", index, tensor.name, tensor.datatype,
                               list(tensor.shape), data=values)
    return oip.tensor_from("input", index, tensor.name, tensor.datatype, list(tensor.shape),
                           raw=raw)


def encode_response(model: str, version: str | None, request_id: str | None,
                    outputs: Mapping[str, np.ndarray], params: Mapping[str, Any]) -> Any:
    """An answer as a ``ModelInferResponse``, every tensor in ``raw_output_contents``."""
    msg = messages().ModelInferResponse(model_name=model, model_version=version or "",
                                id=request_id or "")
    params_into(msg.parameters, params)
    _add_tensors(msg.outputs, msg.raw_output_contents, outputs)
    return msg


def encode_request(model: str, inputs: Mapping[str, np.ndarray],
                   params: Mapping[str, Any] | None = None, version: str | None = None,
                   request_id: str | None = None) -> Any:
    """A ``ModelInferRequest`` with binary inputs (what a node sends another over gRPC)."""
    msg = messages().ModelInferRequest(model_name=model, model_version=version or "",
                               id=request_id or "")
    params_into(msg.parameters, params or {})
    _add_tensors(msg.inputs, msg.raw_input_contents, inputs)
    return msg


def _add_tensors(declared: Any, raw: Any, tensors: Mapping[str, np.ndarray]) -> None:
    """Each tensor declared (name, datatype, shape) with its binary data beside, in order."""
    for name, value in tensors.items():
        arr = np.asarray(value)
        datatype, data = oip.tensor_raw(name, arr)
        declared.add(name=name, datatype=datatype, shape=list(arr.shape))
        raw.append(bytes(data))


def decode_response(msg: Any) -> oip.InferResponseData:
    """A ``ModelInferResponse`` as the REST codec's response."""
    raw = list(msg.raw_output_contents)
    outputs = {t.name: oip.tensor_from("output", i, t.name, t.datatype, list(t.shape),
                                       raw=raw[i] if raw else None,
                                       data=None if raw else _values(t))
               for i, t in enumerate(msg.outputs)}
    return oip.InferResponseData(msg.model_name, msg.model_version or None, msg.id or None,
                                 outputs, params_from(msg.parameters))


def _values(tensor: Any) -> list[Any]:
    field = _CONTENTS.get(tensor.datatype, "fp32_contents")
    return list(getattr(tensor.contents, field))
