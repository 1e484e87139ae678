"""Request bodies in the OpenAPI documents, for routes that read their body raw (to skip a
second decoding on a hot path, or because it is binary): what a generated client or a
fuzzer learns from ``/openapi.json``. ``request_body(schema)`` is a route's
``openapi_extra``.

The inference request is the Open Inference Protocol v2 one (JSON, or the binary tensor
extension: a JSON header of ``Inference-Header-Content-Length`` bytes, then the tensors'
raw bytes).
"""

from __future__ import annotations

from typing import Any

OIP_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                 "INT64", "FP16", "FP32", "FP64", "BYTES")

_PARAMETERS = {"type": "object", "additionalProperties": True}

OIP_TENSOR: dict[str, Any] = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": list(OIP_DATATYPES)},
        "parameters": {**_PARAMETERS, "description": "binary_data_size: the tensor's bytes "
                                                     "follow the JSON header instead of data"},
        "data": {"type": "array", "description": "the values in row-major order (nested or "
                                                 "flat); absent with binary_data_size"},
    },
}

OIP_INFER_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {**_PARAMETERS, "description": (
            "tierlink.deadline_ms, tierlink.privacy (local|site|any), tierlink.priority "
            "(realtime|interactive|batch), tierlink.version, tierlink.origin, ...: see "
            "tierlink.node.protocol")},
        "inputs": {"type": "array", "minItems": 1, "items": OIP_TENSOR},
        "outputs": {"type": "array", "items": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS}}},
    },
}

OIP_REPOSITORY_INDEX: dict[str, Any] = {
    "type": "object", "properties": {"ready": {"type": "boolean"}}}

BYTES: dict[str, Any] = {"type": "string", "format": "binary"}


def request_body(schema: dict[str, Any], *, binary: bool = False, required: bool = True,
                 media_type: str = "application/json") -> dict[str, Any]:
    """``openapi_extra`` declaring a body of ``schema``; ``binary``: the OIP binary tensor
    extension is taken too."""
    content: dict[str, Any] = {media_type: {"schema": schema}}
    if binary:
        content["application/octet-stream"] = {"schema": BYTES}
    return {"requestBody": {"required": required, "content": content}}


def model_schema(model: Any) -> dict[str, Any]:
    """A pydantic model's JSON schema with its nested models written in place (a body
    declared through ``openapi_extra`` gets no ``components`` of its own, so a ``$ref`` to
    one would leave a fuzzer or a client generator unable to read that part)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return {**inline(defs[ref.removeprefix("#/$defs/")]), **inline(rest)}
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return dict(inline(schema))


_SAMPLING = {
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "seed": {"type": "integer"},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "tierlink": {"type": "object", "description": (
        "deadline_ms, privacy (local|site|any), priority, session, mode, ttft_ms, "
        "min_tokens_per_s: see tierlink.chat.openai")},
}

OPENAI_CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "description": "a model or a task this fleet routes"},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"type": "string",
                                    "enum": ["system", "user", "assistant", "developer"]},
                           "content": {"type": "string"}}}},
        **_SAMPLING,
    },
}

OPENAI_COMPLETION_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {"model": {"type": "string"}, "prompt": {"type": "string"}, **_SAMPLING},
}
