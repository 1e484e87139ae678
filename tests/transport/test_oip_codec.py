"""Round trips through the OIP v2 codec: every datatype, JSON and binary, mixed, BYTES."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest

from tierlink.errors import AdmissionRefused, InvalidRequest, TensorError
from tierlink.transport.oip import (
    BINARY_CONTENT_TYPE,
    DATATYPES,
    HEADER_LENGTH,
    JSON_CONTENT_TYPE,
    InferRequestData,
    RequestedOutput,
    compress_body,
    datatype_of,
    decode_infer_request,
    decode_infer_response,
    decompress_body,
    encode_infer_request,
    encode_infer_response,
    error_body,
    numpy_dtype,
    pack_param,
    parse_header_length,
    unpack_param,
)


def sample(datatype: str, shape: tuple[int, ...] = (2, 3), seed: int = 0) -> np.ndarray:
    """A tensor of ``datatype`` that includes the extreme values of its type."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if datatype == "BYTES":
        words = [b"", b"a", "h\u00e9llo \u4e16\u754c".encode(), b"x" * 300, b"tab\tnew\nline"]
        items = [words[i % len(words)] for i in range(count)]
        arr = np.empty(count, dtype=object)
        arr[:] = items
        return arr.reshape(shape)
    dtype = numpy_dtype(datatype)
    if datatype == "BOOL":
        return (rng.integers(0, 2, count) == 1).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
        values[:2] = [info.min, info.max][: min(2, count)]
        return values.reshape(shape)
    values = rng.standard_normal(count).astype(dtype) * 1000
    special = [np.finfo(dtype).max, np.finfo(dtype).tiny, -0.0, np.inf, -np.inf, np.nan]
    values[: min(len(special), count)] = special[: min(len(special), count)]
    return values.reshape(shape)


def header_length(headers: dict[str, str]) -> int | None:
    return parse_header_length(headers.get(HEADER_LENGTH))


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.dtype == object
        assert got.ravel().tolist() == [
            x if isinstance(x, bytes) else str(x).encode() for x in want.ravel()
        ]
    else:
        assert got.dtype == want.dtype
        # Bit-exact, NaN and -0.0 included.
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_request_round_trip_every_datatype(datatype: str, binary: bool) -> None:
    tensor = sample(datatype)
    body, headers = encode_infer_request({"x": tensor}, {"p": 1}, None, binary, binary, "r-7")
    assert (HEADER_LENGTH in headers) == binary
    request = decode_infer_request(body, header_length(headers))
    assert request.id == "r-7"
    assert request.parameters == {"p": 1}
    assert request.binary_output_default is binary
    assert request.outputs == []
    assert_same(request.inputs["x"], tensor)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_response_round_trip_every_datatype(datatype: str, binary: bool) -> None:
    tensor = sample(datatype, (3, 1, 2), seed=1)
    body, headers = encode_infer_response(
        "m", "2", "r-1", {"y": tensor}, {"served_by": "e1"}, binary
    )
    assert headers["Content-Type"] == (BINARY_CONTENT_TYPE if binary else JSON_CONTENT_TYPE)
    response = decode_infer_response(body, header_length(headers))
    assert (response.model_name, response.model_version, response.id) == ("m", "2", "r-1")
    assert response.parameters == {"served_by": "e1"}
    assert_same(response.outputs["y"], tensor)


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 2), (1,), (2, 1, 1, 3)])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_scalar_and_empty_shapes_round_trip(shape: tuple[int, ...], binary: bool) -> None:
    tensors = {dt: sample(dt, shape) for dt in ("FP32", "BYTES", "BOOL", "INT64")}
    body, headers = encode_infer_request(tensors, None, None, binary, binary)
    decoded = decode_infer_request(body, header_length(headers)).inputs
    for name, tensor in tensors.items():
        assert_same(decoded[name], tensor)


def test_mixed_binary_and_json_outputs_keep_order_and_bytes() -> None:
    outputs = {"a": sample("FP16"), "b": sample("BYTES"), "c": sample("UINT8"), "d": sample("FP64")}
    body, headers = encode_infer_response("m", None, None, outputs, None, {"a", "c"})
    doc = json.loads(body[: header_length(headers)])
    assert [o["name"] for o in doc["outputs"]] == ["a", "b", "c", "d"]
    assert "binary_data_size" in doc["outputs"][0]["parameters"]
    assert "data" in doc["outputs"][1] and "data" in doc["outputs"][3]
    assert "model_version" not in doc and "id" not in doc
    decoded = decode_infer_response(body, header_length(headers)).outputs
    for name, tensor in outputs.items():
        assert_same(decoded[name], tensor)


def test_mixed_request_with_hand_written_body() -> None:
    # Binary tensors take the binary section in list order, JSON tensors take none of it.
    a = np.arange(4, dtype=np.int32)
    c = np.array([1.5, -2.0], dtype=np.float64)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "a",
                    "shape": [2, 2],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 16},
                },
                {"name": "b", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2.5], [3, 4]]},
                {
                    "name": "c",
                    "shape": [2],
                    "datatype": "FP64",
                    "parameters": {"binary_data_size": 16},
                },
                {"name": "d", "shape": [3], "datatype": "BYTES", "data": ["x", "", "\u00e9"]},
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": False}}, {"name": "z"}],
            "parameters": {"binary_data_output": True, "trace": "t1"},
        }
    ).encode()
    request = decode_infer_request(head + a.tobytes() + c.tobytes(), len(head))
    assert_same(request.inputs["a"], a.reshape(2, 2))
    assert_same(request.inputs["b"], np.array([[1, 2.5], [3, 4]], dtype=np.float32))
    assert_same(request.inputs["c"], c)
    assert request.inputs["d"].tolist() == [b"x", b"", "\u00e9".encode()]
    assert request.outputs == [RequestedOutput("y", False), RequestedOutput("z", None)]
    assert request.parameters == {"trace": "t1"}
    assert request.binary_outputs(["y", "z", "w"]) == {"z", "w"}


def test_binary_output_choice_follows_per_output_override() -> None:
    request = InferRequestData(
        None, {}, {}, [RequestedOutput("a", True), RequestedOutput("b")], False
    )
    assert request.binary_outputs(["a", "b", "c"]) == {"a"}
    request.binary_output_default = True
    assert request.binary_outputs(["a", "b", "c"]) == {"a", "b", "c"}


def test_bytes_that_are_not_utf8_fall_back_to_binary_in_json_mode() -> None:
    blob = np.array([b"\xff\xfe\x00raw", b"ok"], dtype=object)
    body, headers = encode_infer_response(
        "m", None, None, {"blob": blob, "n": sample("INT8")}, None, False
    )
    assert HEADER_LENGTH in headers
    doc = json.loads(body[: header_length(headers)])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 4 + 6 + 4 + 2
    assert "data" in doc["outputs"][1]
    assert_same(decode_infer_response(body, header_length(headers)).outputs["blob"], blob)


def test_bytes_tensor_encoding_is_length_prefixed_row_major() -> None:
    strings = np.array([["ab", "c"], ["", "d\u00e9"]])  # numpy str array → BYTES
    assert datatype_of(strings.dtype) == "BYTES"
    body, headers = encode_infer_request({"s": strings.T}, None, None)
    binary = body[header_length(headers) :]
    # strings.T in row-major order: "ab", "", "c", "dé"
    assert (
        binary
        == b"\x02\x00\x00\x00ab" + b"\x00" * 4 + b"\x01\x00\x00\x00c" + b"\x03\x00\x00\x00d\xc3\xa9"
    )


def test_non_contiguous_and_big_endian_arrays_are_sent_row_major_little_endian() -> None:
    base = np.arange(12, dtype=">i4").reshape(3, 4)
    view = base[:, ::2].T  # (2, 3), non-contiguous, big-endian
    body, headers = encode_infer_request({"v": view}, None, None)
    assert body[header_length(headers) :] == np.ascontiguousarray(view, dtype="<i4").tobytes()
    decoded = decode_infer_request(body, header_length(headers)).inputs["v"]
    assert decoded.tolist() == view.tolist() and decoded.dtype == np.int32


def test_requested_outputs_are_sent_with_their_binary_flag() -> None:
    body, headers = encode_infer_request({"x": sample("FP32")}, None, ["y", "z"], True, False)
    request = decode_infer_request(body, header_length(headers))
    assert request.outputs == [RequestedOutput("y", False), RequestedOutput("z", False)]
    assert request.binary_output_default is False


def test_non_scalar_parameters_must_be_packed() -> None:
    with pytest.raises(InvalidRequest, match="pack_param"):
        encode_infer_request({"x": sample("FP32")}, {"path": ["dev-1", "edge-1"]}, None)
    params = {
        "path": pack_param(["dev-1", "edge-1"]),
        "cfg": pack_param({"a": None}),
        "k": pack_param(3),
    }
    body, headers = encode_infer_request({"x": sample("FP32")}, params, None)
    got = decode_infer_request(body, header_length(headers)).parameters
    assert unpack_param(got["path"]) == ["dev-1", "edge-1"]
    assert unpack_param(got["cfg"]) == {"a": None}
    assert unpack_param(got["k"]) == 3
    assert unpack_param("[not json") == "[not json" and unpack_param("plain") == "plain"
    assert unpack_param(pack_param(None)) is None


def test_numpy_scalars_in_parameters_are_plain_json() -> None:
    body, _ = encode_infer_response("m", None, None, {}, {"confidence": np.float32(0.5)}, False)
    assert json.loads(body)["parameters"] == {"confidence": 0.5}
    body, _ = encode_infer_request({"x": sample("FP32")}, {"k": np.int64(3)}, None, False, False)
    assert json.loads(body)["parameters"] == {"k": 3}
    with pytest.raises(InvalidRequest, match="parameter 'path' is a list"):
        encode_infer_response("m", None, None, {}, {"path": ["a"]}, False)


def test_binary_tensors_decode_in_place_without_a_copy() -> None:
    # The encoder pads the JSON part to 8 bytes, so the binary section is aligned.
    tensors = {"a": sample("FP64", (3,)), "b": sample("INT8", (5,)), "c": sample("FP32", (7,))}
    body, headers = encode_infer_request(tensors, None, None)
    assert header_length(headers) % 8 == 0
    decoded = decode_infer_request(body, header_length(headers)).inputs
    whole = np.frombuffer(body, dtype=np.uint8)
    assert np.shares_memory(decoded["a"], whole) and np.shares_memory(decoded["b"], whole)
    # "c" starts at 24 + 5 = 29 bytes into the binary section: unaligned, so it is copied.
    assert not np.shares_memory(decoded["c"], whole) and decoded["c"].flags.aligned
    assert_same(decoded["c"], tensors["c"])


def test_datatype_names_map_both_ways() -> None:
    for name in DATATYPES:
        assert datatype_of(numpy_dtype(name)) == name
    assert datatype_of(np.dtype("S3")) == "BYTES"
    with pytest.raises(TensorError, match="complex128"):
        datatype_of(np.complex128)
    with pytest.raises(TensorError, match="unknown datatype 'BF16'"):
        numpy_dtype("BF16")


def test_compress_only_when_asked_and_decompress_every_flavour() -> None:
    body, headers = encode_infer_response("m", None, None, {"y": sample("FP32")}, None, True)
    same, plain = compress_body(body, headers, None)
    assert same is body and "Content-Encoding" not in plain
    assert compress_body(body, headers, "br, identity")[0] is body
    assert compress_body(body, headers, "gzip;q=0, deflate")[1]["Content-Encoding"] == "deflate"
    zipped, zheaders = compress_body(body, headers, "deflate;q=0.5, gzip")
    assert (
        zheaders["Content-Encoding"] == "gzip" and zheaders[HEADER_LENGTH] == headers[HEADER_LENGTH]
    )
    assert gzip.decompress(zipped) == body
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    for encoded, coding in [
        (gzip.compress(body), "gzip"),
        (zlib.compress(body), "deflate"),
        (raw.compress(body) + raw.flush(), "deflate"),
        (body, "identity"),
        (zlib.compress(gzip.compress(body)), "gzip, deflate"),
    ]:
        assert decompress_body(encoded, coding) == body


def test_decompression_is_bounded() -> None:
    bomb = gzip.compress(b"\0" * 100_000)
    with pytest.raises(InvalidRequest, match="inflates past 1000 bytes"):
        decode_infer_request(bomb, None, "gzip", max_body_bytes=1000)
    with pytest.raises(InvalidRequest, match="not valid gzip"):
        decode_infer_request(b"not gzip", None, "gzip")
    with pytest.raises(InvalidRequest, match="unsupported Content-Encoding 'br'"):
        decode_infer_request(b"{}", None, "br")


def test_error_body_carries_code_and_hint() -> None:
    err = AdmissionRefused("queue full on edge-1", node="edge-1")
    doc = json.loads(error_body(err))
    assert doc == {
        "error": "queue full on edge-1",
        "code": "admission_refused",
        "hint": AdmissionRefused.hint,
        "details": {"node": "edge-1"},
    }


@pytest.mark.parametrize("value, expected", [(None, None), ("0", 0), (" 123 ", 123)])
def test_parse_header_length(value: str | None, expected: int | None) -> None:
    assert parse_header_length(value) == expected


@pytest.mark.parametrize("value", ["-1", "1.5", "abc", ""])
def test_parse_header_length_rejects_garbage(value: str) -> None:
    with pytest.raises(InvalidRequest, match=HEADER_LENGTH):
        parse_header_length(value)
