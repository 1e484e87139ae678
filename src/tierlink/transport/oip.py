"""Open Inference Protocol v2 (KServe / Triton REST) wire format, with Triton's binary tensors.

Pure encoding and decoding: bytes in, numpy arrays out and back, no I/O, no framework. The node's
HTTP app calls the server half (:func:`decode_infer_request`, :func:`encode_infer_response`,
:func:`error_body`) once per request; :class:`tierlink.transport.client.OipClient` calls the client
half (:func:`encode_infer_request`, :func:`decode_infer_response`).

Wire format (what stock ``tritonclient[http]`` sends and expects):

* The body is one JSON object, optionally followed by a binary section. When the binary section is
  present, the HTTP header ``Inference-Header-Content-Length`` gives the JSON object's length in
  bytes; the binary section is everything after it.
* A tensor whose ``parameters.binary_data_size`` is set carries its data in the binary section
  (tensors consume it in the order they are listed), little-endian, row-major, no padding. BOOL is
  one byte (0 or 1). BYTES elements are each a 4-byte little-endian length then the raw bytes.
  Otherwise the tensor carries a JSON ``data`` list, flat or nested, in row-major order.
* A request asks for binary outputs with ``parameters.binary_data_output`` (all outputs) and/or a
  per-output ``parameters.binary_data`` that overrides it.
* Errors are ``{"error": "<message>"}``; tierlink adds ``code``, ``hint`` and ``details``.

Decoded BYTES tensors are always numpy ``object`` arrays of ``bytes`` (JSON strings are encoded as
UTF-8), whichever way they travelled. Decoded numeric tensors may be read-only views of the body:
copy before mutating them.

Every decoding error is a :class:`~tierlink.errors.TensorError` (one tensor is wrong) or an
:class:`~tierlink.errors.InvalidRequest` (the message is wrong) whose message names the tensor
and the fault; no byte string makes a decoder raise anything else.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from math import isfinite, prod
from typing import Any

import numpy as np
import orjson

from tierlink.errors import InvalidRequest, TensorError, TierlinkError

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_CONTENT_TYPE = "application/json"
# What Triton answers with when the body carries a binary section.
BINARY_CONTENT_TYPE = "application/octet-stream"
# Ceiling on a decompressed request body, so a tiny gzip bomb cannot exhaust memory.
MAX_BODY_BYTES = 256 * 1024 * 1024

Buffer = bytes | bytearray | memoryview
# A binary chunk of the body: bytes, or a view of a contiguous array (joined without a copy).
Chunk = bytes | memoryview
Scalar = str | int | float | bool

# Explicit little-endian dtypes: the wire is little-endian whatever the host is.
_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_BY_KIND: dict[tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in _DTYPES.items() if name != "BYTES"
}
DATATYPES: tuple[str, ...] = tuple(_DTYPES)
# Tensor parameters naming Triton extensions that tierlink does not implement.
_UNSUPPORTED_PARAMS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


# ----------------------------------------------------------------------------- datatypes


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of an OIP datatype name (``"FP32"`` → float32, ``"BYTES"`` → object)."""
    try:
        return _DTYPES[datatype]
    except (KeyError, TypeError):
        raise TensorError(
            f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        ) from None


def datatype_of(dtype: np.dtype[Any] | type) -> str:
    """The OIP datatype name of a numpy dtype; object, bytes and str arrays are ``BYTES``."""
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "BYTES"
    name = _BY_KIND.get((dt.kind, dt.itemsize))
    if name is None:
        raise TensorError(
            f"numpy dtype {dt} has no Open Inference Protocol datatype; "
            f"convert the array to one of {', '.join(DATATYPES)}"
        )
    return name


# ----------------------------------------------------------------------------- parameters


def pack_param(value: Any) -> Scalar:
    """A value as an OIP parameter: scalars pass through, anything else becomes JSON text.

    OIP parameter values must be strings, numbers or booleans; lists, dicts and ``None`` are
    sent as their JSON text and read back with :func:`unpack_param`.
    """
    if isinstance(value, str | bool | int | float):
        return value
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"parameter value {value!r} cannot be sent as JSON: {exc}") from exc


def unpack_param(value: Any) -> Any:
    """The inverse of :func:`pack_param`: JSON text of a list, dict or null is parsed back.

    A plain string that is not such JSON text is returned unchanged. Call this only for
    parameters known to be packed: a literal string like ``"[1]"`` would be parsed.
    """
    if not isinstance(value, str) or not value or value[0] not in "[{n":
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if parsed is None or isinstance(parsed, list | dict) else value


def _check_scalar_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``params`` with numpy scalars made plain; raises if a value is not a scalar."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, np.generic) and value.ndim == 0:
            value = value.item()
        if not isinstance(value, str | bool | int | float):
            raise InvalidRequest(
                f"parameter {key!r} is a {type(value).__name__}; OIP parameters must be "
                "strings, numbers or booleans: wrap it with tierlink.transport.oip.pack_param()"
            )
        out[key] = value
    return out


# ----------------------------------------------------------------------------- HTTP helpers


def parse_header_length(value: str | None) -> int | None:
    """Parse an ``Inference-Header-Content-Length`` header value (``None`` when absent)."""
    if value is None:
        return None
    text = value.strip()
    # isascii: str.isdigit() accepts digits like "²" that int() rejects; 18 digits is ~1 EB.
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise InvalidRequest(
            f"{HEADER_LENGTH} must be a non-negative integer, got {value!r}",
            hint="send the byte length of the JSON part of the body",
        )
    return int(text)


def decompress_body(
    body: Buffer, content_encoding: str | None, max_bytes: int = MAX_BODY_BYTES
) -> bytes:
    """Undo a ``Content-Encoding`` of gzip, deflate (zlib or raw) or identity.

    Encodings listed as ``"gzip, deflate"`` are undone last first, as HTTP applies them in order.
    Raises :class:`InvalidRequest` for an unknown encoding, corrupt data, or more than
    ``max_bytes`` of output.
    """
    data = bytes(body)
    if not content_encoding:
        return data
    for coding in reversed([c.strip().lower() for c in content_encoding.split(",")]):
        if coding in ("", "identity"):
            continue
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise InvalidRequest(
                f"unsupported Content-Encoding {coding!r}",
                hint="send the body uncompressed, or compressed with gzip or deflate",
            )
        data = _inflate(data, coding, max_bytes)
    return data


def _inflate(data: bytes, coding: str, max_bytes: int) -> bytes:
    # gzip: wbits 16+15. deflate: HTTP means zlib-wrapped (as tritonclient sends); some clients
    # send raw deflate (-15), so try that second.
    attempts = (31,) if coding != "deflate" else (15, -15)
    error: Exception | None = None
    for wbits in attempts:
        try:
            inflater = zlib.decompressobj(wbits)
            out = inflater.decompress(data, max_bytes)
            if inflater.unconsumed_tail:
                raise InvalidRequest(f"the {coding} body inflates past {max_bytes} bytes")
            if not inflater.eof:
                raise zlib.error("incomplete or truncated stream")
            return out
        except zlib.error as exc:
            error = exc
    raise InvalidRequest(f"the body is not valid {coding} data: {error}") from error


def compress_body(
    body: bytes, headers: Mapping[str, str], accept_encoding: str | None
) -> tuple[bytes, dict[str, str]]:
    """Compress a response only if the client asked for gzip or deflate in ``Accept-Encoding``.

    ``Inference-Header-Content-Length`` keeps the uncompressed JSON length: clients decompress
    first, then split (tritonclient does). Returns the body and headers to send.
    """
    coding = _pick_encoding(accept_encoding)
    out = dict(headers)
    if coding is None:
        return body, out
    out["Content-Encoding"] = coding
    if coding == "gzip":
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        return compressor.compress(body) + compressor.flush(), out
    return zlib.compress(body), out


def _pick_encoding(accept_encoding: str | None) -> str | None:
    best: tuple[float, str] | None = None
    for item in (accept_encoding or "").split(","):
        token, _, qpart = item.strip().partition(";")
        token = token.strip().lower()
        if token not in ("gzip", "deflate"):
            continue
        q = _quality(qpart)
        # Highest quality wins; on a tie gzip beats deflate (both are cheap to inflate).
        if q > 0 and (best is None or (q, token == "gzip") > (best[0], best[1] == "gzip")):
            best = (q, token)
    return None if best is None else best[1]


def _quality(qpart: str) -> float:
    key, _, value = qpart.strip().partition("=")
    if key.strip().lower() != "q":
        return 1.0
    try:
        return float(value)
    except ValueError:
        return 0.0


def error_body(err: TierlinkError) -> bytes:
    """The JSON body of an error response: ``{"error", "code", "hint", "details"}``."""
    return json.dumps(err.to_dict(), separators=(",", ":"), default=str).encode()


# ----------------------------------------------------------------------------- data classes


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """One entry of a request's ``outputs`` list.

    ``binary`` is the output's ``parameters.binary_data``; ``None`` when the client did not say,
    in which case the request's ``binary_output_default`` applies.
    """

    name: str
    binary: bool | None = None


@dataclass(slots=True)
class InferRequestData:
    """A decoded inference request.

    ``parameters`` are the request-level parameters minus ``binary_data_output``, which is
    ``binary_output_default``. ``outputs`` is empty when the client wants every output.
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    outputs: list[RequestedOutput]
    binary_output_default: bool

    def wants_binary(self, name: str) -> bool:
        """Whether output ``name`` should be sent as binary data."""
        for out in self.outputs:
            if out.name == name and out.binary is not None:
                return out.binary
        return self.binary_output_default

    def binary_outputs(self, names: Iterable[str]) -> set[str]:
        """The subset of ``names`` to send as binary: pass it to :func:`encode_infer_response`."""
        return {name for name in names if self.wants_binary(name)}


@dataclass(slots=True)
class InferResponseData:
    """A decoded inference response."""

    model_name: str
    model_version: str | None
    id: str | None
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any]


# ----------------------------------------------------------------------------- encoding


def encode_infer_response(
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    parameters: Mapping[str, Any] | None,
    binary: bool | AbstractSet[str],
) -> tuple[bytes, dict[str, str]]:
    """Encode an inference response; returns the body and the headers to send with it.

    ``binary`` is True (every output binary), False (every output JSON) or the set of output
    names to send binary (see :meth:`InferRequestData.binary_outputs`). ``parameters`` values
    must be scalars (see :func:`pack_param`). A BYTES output that is
    not valid UTF-8 cannot be JSON and is sent binary even if JSON was asked for; every OIP
    client reads either form. The headers hold ``Content-Type`` and, when any output is
    binary, ``Inference-Header-Content-Length``.
    """
    header: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        header["model_version"] = model_version
    if request_id is not None:
        header["id"] = request_id
    if parameters:
        header["parameters"] = _check_scalar_params(parameters)
    header["outputs"], chunks, any_binary = _encode_tensors(outputs, _binary_rule(binary))
    return _assemble(header, chunks, any_binary)


def encode_infer_request(
    inputs: Mapping[str, np.ndarray],
    parameters: Mapping[str, Any] | None,
    outputs: list[str] | None,
    binary_inputs: bool = True,
    binary_outputs: bool = True,
    request_id: str | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Encode an inference request; returns the body and the headers to send with it.

    ``parameters`` values must be scalars (see :func:`pack_param`). ``outputs`` names the
    outputs wanted (None: all of them); ``binary_outputs`` asks for them as binary data.
    """
    header: dict[str, Any] = {}
    if request_id is not None:
        header["id"] = request_id
    params = _check_scalar_params(parameters or {})
    if outputs is None:
        if binary_outputs:
            params["binary_data_output"] = True
    else:
        header["outputs"] = [
            {"name": name, "parameters": {"binary_data": binary_outputs}} for name in outputs
        ]
    if params:
        header["parameters"] = params
    header["inputs"], chunks, any_binary = _encode_tensors(inputs, lambda _: binary_inputs)
    body, headers = _assemble(header, chunks, any_binary)
    for param, name in HINT_HEADERS.items():
        if param in params:
            headers[name] = str(params[param])
    return body, headers


# Hints in HTTP headers that mirror tierlink's routing parameters: an overloaded node reads
# them to shed a less urgent request before it reads or decodes the body. The parameters
# stay the truth (a request whose hint and parameter disagree is judged by the parameter).
PRIORITY_HEADER = "tierlink-priority"
DEADLINE_HEADER = "tierlink-deadline-ms"
HINT_HEADERS = {"tierlink.priority": PRIORITY_HEADER, "tierlink.deadline_ms": DEADLINE_HEADER}


def _binary_rule(binary: bool | AbstractSet[str]) -> Callable[[str], bool]:
    if isinstance(binary, bool):
        return lambda _: binary
    return binary.__contains__


def _encode_tensors(
    tensors: Mapping[str, np.ndarray], binary_for: Callable[[str], bool]
) -> tuple[list[dict[str, Any]], list[Chunk], bool]:
    entries: list[dict[str, Any]] = []
    chunks: list[Chunk] = []
    any_binary = False
    for name, value in tensors.items():
        entry, chunk = _encode_tensor(name, np.asarray(value), binary_for(name))
        entries.append(entry)
        if chunk is not None:
            chunks.append(chunk)
            any_binary = True
    return entries, chunks, any_binary


def _encode_tensor(name: str, arr: np.ndarray, binary: bool) -> tuple[dict[str, Any], Chunk | None]:
    """One tensor's JSON entry, plus its binary chunk when it travels as binary data."""
    datatype = datatype_of(arr.dtype)
    entry: dict[str, Any] = {"name": name, "shape": list(arr.shape), "datatype": datatype}
    if datatype == "BYTES":
        items = [_as_bytes(x) for x in arr.ravel()]  # row-major
        if not binary:
            texts = _utf8_or_none(items)
            if texts is not None:
                entry["data"] = texts
                return entry, None
        chunk: Chunk = b"".join(len(b).to_bytes(4, "little") + b for b in items)
    elif not binary:
        entry["data"] = arr.ravel().tolist()
        return entry, None
    else:
        # Contiguous little-endian, row-major: no copy when the array already is.
        chunk = np.ascontiguousarray(arr, dtype=_DTYPES[datatype]).data
    entry["parameters"] = {
        "binary_data_size": chunk.nbytes if isinstance(chunk, memoryview) else len(chunk)
    }
    return entry, chunk


def tensor_raw(name: str, arr: np.ndarray) -> tuple[str, bytes | memoryview]:
    """A tensor's datatype and its binary data as the protocol lays it out (row-major,
    little-endian; BYTES elements each a uint32 length then the bytes): the binary data
    extension's chunk, and a gRPC message's raw contents."""
    entry, chunk = _encode_tensor(name, arr, True)
    assert chunk is not None  # binary: always a chunk
    return entry["datatype"], chunk


def tensor_from(role: str, index: int, name: str, datatype: str, shape: list[int],
                raw: bytes | None = None, data: list[Any] | None = None) -> np.ndarray:
    """A tensor from its declaration and either its binary data (``raw``) or its values
    (``data``), checked as a REST body's tensors are: the same ``TensorError`` naming it."""
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if raw is not None:
        entry["parameters"] = {"binary_data_size": len(raw)}
    else:
        entry["data"] = data
    head = _tensor_head(entry, index, role)
    return _from_binary(head, memoryview(raw)) if raw is not None else _from_json(head)


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    # Like tritonclient: str and anything else travel as their UTF-8 text.
    return str(item).encode("utf-8")


def _utf8_or_none(items: list[bytes]) -> list[str] | None:
    try:
        return [b.decode("utf-8") for b in items]
    except UnicodeDecodeError:
        return None


def _assemble(
    header: dict[str, Any], chunks: list[Chunk], any_binary: bool
) -> tuple[bytes, dict[str, str]]:
    head = _dumps(header)
    if not any_binary:
        return head, {"Content-Type": JSON_CONTENT_TYPE}
    # Pad the JSON with spaces (still valid JSON) to a multiple of 8 bytes, so the binary
    # section starts aligned and the receiver can use the tensors in place without a copy.
    head += b" " * (-len(head) % _ALIGN)
    headers = {"Content-Type": BINARY_CONTENT_TYPE, HEADER_LENGTH: str(len(head))}
    return b"".join([head, *chunks]), headers


def _dumps(doc: dict[str, Any]) -> bytes:
    """Compact JSON of a request's or response's header: orjson when every tensor travels
    as binary and every parameter is finite (a fifth of the CPU); the standard encoder
    otherwise, which writes what strict JSON lacks (``NaN``) as :func:`_loads` reads it."""
    tensors = (*doc.get("inputs", ()), *doc.get("outputs", ()))
    params = doc.get("parameters") or {}
    if any("data" in t for t in tensors) or any(
            isinstance(v, float) and not isfinite(v) for v in params.values()):
        return _ENCODER.encode(doc).encode()
    try:
        return orjson.dumps(doc, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # what orjson does not take (an integer beyond 64 bits)
        return _ENCODER.encode(doc).encode()


def _json_default(value: Any) -> Any:
    # numpy scalars and arrays that reach parameters; anything else is a caller's bug.
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# One compact encoder for every body: json.dumps builds a new encoder per call when given options.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_json_default)
_ALIGN = 8


# ----------------------------------------------------------------------------- decoding


def decode_infer_request(
    body: Buffer,
    header_length: int | None,
    content_encoding: str | None = None,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> InferRequestData:
    """Decode an inference request body (server side).

    ``header_length`` is the parsed ``Inference-Header-Content-Length`` (see
    :func:`parse_header_length`), None when the header is absent. ``content_encoding`` is the
    request's ``Content-Encoding``; gzip and deflate bodies are decompressed first.
    Raises :class:`TensorError` / :class:`InvalidRequest` and nothing else.
    """
    try:
        data = decompress_body(body, content_encoding, max_body_bytes)
        return _decode_request(data, header_length)
    except TierlinkError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # Safety net for data-dependent failures the explicit checks did not phrase better.
        raise InvalidRequest(f"malformed inference request: {exc}") from exc


def decode_infer_response(body: Buffer, header_length: int | None) -> InferResponseData:
    """Decode an (already decompressed) inference response body (client side).

    Raises :class:`TensorError` / :class:`InvalidRequest` and nothing else; the client turns
    them into :class:`~tierlink.errors.UpstreamError`.
    """
    try:
        return _decode_response(bytes(body) if not isinstance(body, bytes) else body, header_length)
    except TierlinkError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise InvalidRequest(f"malformed inference response: {exc}") from exc


def _decode_request(body: bytes, header_length: int | None) -> InferRequestData:
    doc, binary_start = _split_body(body, header_length, "request")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"request 'id' must be a string, got {type(request_id).__name__}")
    params = dict(_object_field(doc, "parameters", "request"))
    binary_default = params.pop("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidRequest("request parameter 'binary_data_output' must be true or false")
    entries = doc.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise InvalidRequest("request has no 'inputs': send a non-empty list of input tensors")
    inputs = _decode_tensors(entries, "input", body, binary_start, header_length is not None)
    outputs = _requested_outputs(doc.get("outputs"))
    return InferRequestData(request_id, inputs, params, outputs, binary_default)


def _decode_response(body: bytes, header_length: int | None) -> InferResponseData:
    doc, binary_start = _split_body(body, header_length, "response")
    entries = doc.get("outputs")
    if not isinstance(entries, list):
        raise InvalidRequest("response has no 'outputs' list")
    outputs = _decode_tensors(entries, "output", body, binary_start, header_length is not None)
    version, rid = doc.get("model_version"), doc.get("id")
    return InferResponseData(
        model_name=str(doc.get("model_name", "")),
        model_version=None if version is None else str(version),
        id=None if rid is None else str(rid),
        outputs=outputs,
        parameters=dict(_object_field(doc, "parameters", "response")),
    )


def _loads(text: memoryview) -> Any:
    """orjson (~8x the stdlib's speed on tensor data); the stdlib for what strict JSON lacks
    and this codec writes for non-finite floats (``NaN``, ``Infinity``)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(bytes(text))


def _split_body(body: bytes, header_length: int | None, what: str) -> tuple[dict[str, Any], int]:
    """Parse the JSON part; return it and the offset where the binary section starts."""
    if header_length is None:
        header_length = len(body)
    elif header_length < 0 or header_length > len(body):
        raise InvalidRequest(
            f"{HEADER_LENGTH} is {header_length} but the {what} body holds {len(body)} bytes",
            hint=f"{HEADER_LENGTH} must be the byte length of the JSON part of the body",
        )
    try:
        doc = _loads(memoryview(body)[:header_length])
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"the {what} JSON is invalid: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the {what} JSON must be an object, got {type(doc).__name__}")
    return doc, header_length


def _object_field(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} '{key}' must be a JSON object, got {type(value).__name__}")
    return value


def _requested_outputs(entries: Any) -> list[RequestedOutput]:
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise InvalidRequest(f"request 'outputs' must be a list, got {type(entries).__name__}")
    outputs: list[RequestedOutput] = []
    for index, entry in enumerate(entries):
        out = _requested_output(entry, index)
        if any(o.name == out.name for o in outputs):
            raise InvalidRequest(f"output {out.name!r} is requested twice")
        outputs.append(out)
    return outputs


def _requested_output(entry: Any, index: int) -> RequestedOutput:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise InvalidRequest(f"requested output #{index} must be an object with a string 'name'")
    name = entry["name"]
    params = _object_field(entry, "parameters", f"output {name!r}")
    for key in (*_UNSUPPORTED_PARAMS, "classification"):
        if key in params:
            raise InvalidRequest(
                f"output {name!r} asks for '{key}', which tierlink does not support",
                hint="ask for the output as binary or JSON data instead",
            )
    binary = params.get("binary_data")
    if binary is not None and not isinstance(binary, bool):
        raise InvalidRequest(f"output {name!r}: parameters.binary_data must be true or false")
    return RequestedOutput(name, binary)


# ----------------------------------------------------------------------------- tensors


@dataclass(frozen=True, slots=True)
class _TensorHead:
    """What a tensor's JSON entry says, validated, before its data is read."""

    role: str  # "input" or "output": used in messages
    name: str
    datatype: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    count: int  # product(shape)
    data: Any  # the JSON 'data' list, or None for a binary tensor
    binary_size: int | None

    @property
    def label(self) -> str:
        return f"{self.role} {self.name!r}"


def _decode_tensors(
    entries: list[Any], role: str, body: bytes, binary_start: int, has_header: bool
) -> dict[str, np.ndarray]:
    """Decode a request's inputs or a response's outputs; binary tensors consume the binary
    section in list order, which must be used up exactly."""
    view = memoryview(body)
    available = len(body) - binary_start
    offset = 0
    tensors: dict[str, np.ndarray] = {}
    for index, entry in enumerate(entries):
        head = _tensor_head(entry, index, role)
        if head.name in tensors:
            raise InvalidRequest(f"{head.label} appears twice")
        if head.binary_size is None:
            tensors[head.name] = _from_json(head)
            continue
        if not has_header:
            raise TensorError(
                f"{head.label} declares binary_data_size but there is no {HEADER_LENGTH} header",
                hint=f"send {HEADER_LENGTH} with the byte length of the JSON part",
            )
        if head.binary_size > available - offset:
            raise TensorError(
                f"{head.label}: binary data is truncated: it declares {head.binary_size} bytes "
                f"but only {available - offset} bytes of the binary section are left"
            )
        chunk = view[binary_start + offset : binary_start + offset + head.binary_size]
        tensors[head.name] = _from_binary(head, chunk)
        offset += head.binary_size
    if offset != available:
        raise InvalidRequest(
            f"the binary section holds {available} bytes but the {role}s declare {offset}: "
            f"{available - offset} trailing bytes",
            hint=f"check {HEADER_LENGTH} and every binary_data_size",
        )
    return tensors


def _tensor_head(entry: Any, index: int, role: str) -> _TensorHead:
    if not isinstance(entry, dict):
        raise TensorError(f"{role} #{index} must be a JSON object, got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise TensorError(f"{role} #{index} has no 'name' (a non-empty string)")
    label = f"{role} {name!r}"
    datatype = entry.get("datatype")
    if datatype is None:
        raise TensorError(f"{label} has no 'datatype'; expected one of {', '.join(DATATYPES)}")
    if not isinstance(datatype, str) or datatype not in _DTYPES:
        raise TensorError(
            f"{label}: unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        )
    shape = _shape(entry.get("shape"), label)
    data, binary_size = _data_source(entry, label)
    dtype = _DTYPES[datatype]
    return _TensorHead(role, name, datatype, dtype, shape, prod(shape), data, binary_size)


def _shape(value: Any, label: str) -> tuple[int, ...]:
    if value is None:
        raise TensorError(f"{label} has no 'shape' (a list of non-negative integers)")
    if not isinstance(value, list):
        raise TensorError(f"{label}: 'shape' must be a list of integers, got {value!r}")
    for dim in value:
        # bool is an int in Python but not a dimension.
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise TensorError(
                f"{label}: 'shape' {value!r} holds {dim!r}; dimensions must be integers >= 0"
            )
    return tuple(value)


def _data_source(entry: Mapping[str, Any], label: str) -> tuple[Any, int | None]:
    """The JSON data list or the declared binary size (exactly one of them)."""
    params = _object_field(entry, "parameters", label)
    for key in _UNSUPPORTED_PARAMS:
        if key in params:
            raise TensorError(
                f"{label} uses '{key}': shared-memory tensors are not supported by tierlink",
                hint="send the tensor as binary or JSON data",
            )
    size = params.get("binary_data_size")
    data = entry.get("data")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TensorError(f"{label}: binary_data_size must be an integer >= 0, got {size!r}")
        if data is not None:
            raise TensorError(f"{label} has both 'data' and parameters.binary_data_size; send one")
        return None, size
    if data is None:
        raise TensorError(f"{label} has neither 'data' nor parameters.binary_data_size")
    if not isinstance(data, list):
        raise TensorError(
            f"{label}: 'data' must be a (flat or nested) list, got {type(data).__name__}"
        )
    return data, None


def _from_binary(head: _TensorHead, chunk: memoryview) -> np.ndarray:
    if head.datatype == "BYTES":
        return _bytes_array(_split_bytes(head, chunk), head.shape)
    expected = head.count * head.dtype.itemsize
    if head.binary_size != expected:
        raise TensorError(
            f"{head.label}: binary_data_size is {head.binary_size} bytes but shape "
            f"{list(head.shape)} of {head.datatype} needs {expected} "
            f"(product of the shape x {head.dtype.itemsize} bytes)"
        )
    arr = np.frombuffer(chunk, dtype=head.dtype, count=head.count).reshape(head.shape)
    if not arr.flags.aligned:
        arr = arr.copy()  # runtimes may need aligned buffers; the JSON part has any length
    if head.datatype == "BOOL" and head.count and int(arr.view(np.uint8).max()) > 1:
        raise TensorError(f"{head.label}: BOOL binary data holds bytes other than 0 and 1")
    return arr


def _split_bytes(head: _TensorHead, raw: memoryview) -> list[bytes]:
    """Split a binary BYTES tensor: each element is a uint32 LE length then that many bytes."""
    items: list[bytes] = []
    pos, end = 0, len(raw)
    while pos < end:
        if len(items) == head.count:
            raise TensorError(
                f"{head.label}: BYTES binary data holds more than the {head.count} elements "
                f"of shape {list(head.shape)} ({end - pos} bytes left over)"
            )
        if pos + 4 > end:
            raise TensorError(
                f"{head.label}: BYTES element {len(items)} has a truncated 4-byte length"
            )
        size = int.from_bytes(raw[pos : pos + 4], "little")
        pos += 4
        if pos + size > end:
            raise TensorError(
                f"{head.label}: BYTES element {len(items)} declares {size} bytes but only "
                f"{end - pos} remain in its binary_data_size"
            )
        items.append(bytes(raw[pos : pos + size]))
        pos += size
    if len(items) != head.count:
        raise TensorError(
            f"{head.label}: BYTES binary data holds {len(items)} elements but shape "
            f"{list(head.shape)} needs {head.count}"
        )
    return items


def _bytes_array(items: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    arr[:] = items  # slice assignment keeps each bytes object whole
    return arr.reshape(shape)


def _from_json(head: _TensorHead) -> np.ndarray:
    if head.datatype == "BYTES":
        items = _flatten_strings(head)
        if len(items) != head.count:
            raise TensorError(_count_message(head, len(items)))
        return _bytes_array(items, head.shape)
    try:
        raw = np.asarray(head.data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise TensorError(
            f"{head.label}: 'data' is not a regular nested list of numbers ({exc})"
        ) from exc
    if raw.size != head.count:
        raise TensorError(_count_message(head, raw.size))
    if raw.size:
        raw = _checked_values(head, raw)
    # (count,) or nested → (shape...)
    return raw.astype(head.dtype, copy=False).reshape(head.shape)


def _count_message(head: _TensorHead, got: int) -> str:
    return (
        f"{head.label}: 'data' holds {got} values but shape {list(head.shape)} needs "
        f"{head.count} (the product of the shape)"
    )


def _flatten_strings(head: _TensorHead) -> list[bytes]:
    out: list[bytes] = []
    stack: list[Any] = [iter(head.data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            if not isinstance(item, str):
                raise TensorError(f"{head.label}: BYTES 'data' holds {item!r}; expected strings")
            out.append(item.encode("utf-8"))
        else:
            stack.pop()
    return out


def _checked_values(head: _TensorHead, raw: np.ndarray) -> np.ndarray:
    """Reject values whose JSON type does not fit the datatype (numpy would coerce them)."""
    kind, target = raw.dtype.kind, head.dtype.kind
    if target == "b":
        if kind == "b" or (kind in "iu" and int(raw.min()) >= 0 and int(raw.max()) <= 1):
            return raw
        raise TensorError(f"{head.label}: BOOL 'data' must hold true/false values")
    if target == "f":
        if kind in "iuf":
            return raw
        raise TensorError(
            f"{head.label}: {head.datatype} 'data' must hold numbers, found {_kind_name(kind)}"
        )
    if kind in "fO" and head.datatype == "UINT64":
        raw = _big_uint64(head)  # numpy reads [1, 2**64-1] as float64
        kind = raw.dtype.kind
    if kind not in "iu":
        raise TensorError(
            f"{head.label}: {head.datatype} 'data' must hold integers, found {_kind_name(kind)}"
        )
    info = np.iinfo(head.dtype)
    low, high = int(raw.min()), int(raw.max())
    if low < info.min or high > info.max:
        raise TensorError(
            f"{head.label}: value {low if low < info.min else high} is out of range for "
            f"{head.datatype} [{info.min}, {info.max}]"
        )
    return raw


def _big_uint64(head: _TensorHead) -> np.ndarray:
    items = np.asarray(head.data, dtype=object).ravel()
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        return np.asarray(head.data)  # not all integers: let the caller report it
    if any(x < 0 or x >= 2**64 for x in items):
        raise TensorError(f"{head.label}: a value is out of range for UINT64 [0, {2**64 - 1}]")
    return np.array([int(x) for x in items], dtype=np.uint64)


def _kind_name(kind: str) -> str:
    return {"b": "booleans", "f": "non-integer numbers", "U": "strings", "S": "strings"}.get(
        kind, "non-numeric values"
    )
