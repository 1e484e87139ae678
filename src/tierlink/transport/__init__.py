"""tierlink.transport: the Open Inference Protocol v2 wire format and the async client.

* :mod:`tierlink.transport.oip` — pure encode/decode of OIP v2 REST bodies, JSON and Triton's
  binary tensor data extension (numpy only).
* :mod:`tierlink.transport.client` — :class:`OipClient`, the pooled async client nodes use to
  call each other, mapping httpx errors to the tierlink error tree.

Importing this package imports neither numpy nor httpx; the names below load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierlink.transport.client import OipClient
    from tierlink.transport.oip import (
        InferRequestData,
        InferResponseData,
        RequestedOutput,
        decode_infer_request,
        decode_infer_response,
        encode_infer_request,
        encode_infer_response,
        error_body,
    )

_LAZY = {
    "OipClient": "tierlink.transport.client",
    "InferRequestData": "tierlink.transport.oip",
    "InferResponseData": "tierlink.transport.oip",
    "RequestedOutput": "tierlink.transport.oip",
    "decode_infer_request": "tierlink.transport.oip",
    "decode_infer_response": "tierlink.transport.oip",
    "encode_infer_request": "tierlink.transport.oip",
    "encode_infer_response": "tierlink.transport.oip",
    "error_body": "tierlink.transport.oip",
}

__all__ = [
    "InferRequestData",
    "InferResponseData",
    "OipClient",
    "RequestedOutput",
    "decode_infer_request",
    "decode_infer_response",
    "encode_infer_request",
    "encode_infer_response",
    "error_body",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tierlink.transport' has no attribute {name!r}")
    return getattr(import_module(module), name)
