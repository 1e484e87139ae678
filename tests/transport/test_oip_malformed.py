"""Malformed OIP bodies: each fault gives a precise TensorError / InvalidRequest, and no byte
string makes a decoder raise anything else."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from tierlink.errors import InvalidRequest, TensorError
from tierlink.transport.oip import (
    HEADER_LENGTH,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
)


def tensor(**fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}
    entry.update(fields)
    return {k: v for k, v in entry.items() if v is not DROP}


DROP = object()


def request(*inputs: dict[str, Any], **top: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **top}).encode()


def binary(entry: dict[str, Any], payload: bytes, **top: Any) -> tuple[bytes, int]:
    head = request(entry, **top)
    return head + payload, len(head)


JSON_CASES: list[tuple[str, bytes, type[Exception], str]] = [
    ("not json", b"{nope", InvalidRequest, "request JSON is invalid"),
    ("not utf8", b"\xff\xfe{", InvalidRequest, "request JSON is invalid"),
    ("array at top", b"[1, 2]", InvalidRequest, "must be an object, got list"),
    ("no inputs", b"{}", InvalidRequest, "request has no 'inputs'"),
    ("empty inputs", request(), InvalidRequest, "request has no 'inputs'"),
    ("inputs not list", b'{"inputs": {"x": 1}}', InvalidRequest, "request has no 'inputs'"),
    ("id not string", request(tensor(), id=5), InvalidRequest, "'id' must be a string"),
    (
        "params not object",
        request(tensor(), parameters=[1]),
        InvalidRequest,
        "'parameters' must be a JSON object",
    ),
    (
        "binary_data_output not bool",
        request(tensor(), parameters={"binary_data_output": "yes"}),
        InvalidRequest,
        "'binary_data_output' must be true or false",
    ),
    ("input not object", request("x"), TensorError, "input #0 must be a JSON object"),
    ("missing name", request(tensor(name=DROP)), TensorError, "input #0 has no 'name'"),
    ("empty name", request(tensor(name="")), TensorError, "input #0 has no 'name'"),
    ("missing shape", request(tensor(shape=DROP)), TensorError, "input 'x' has no 'shape'"),
    (
        "missing datatype",
        request(tensor(datatype=DROP)),
        TensorError,
        "input 'x' has no 'datatype'",
    ),
    (
        "unknown datatype",
        request(tensor(datatype="FLOAT")),
        TensorError,
        "input 'x': unknown datatype 'FLOAT'",
    ),
    ("negative dim", request(tensor(shape=[-1])), TensorError, "dimensions must be integers >= 0"),
    ("float dim", request(tensor(shape=[2.0])), TensorError, "'shape' [2.0] holds 2.0"),
    ("bool dim", request(tensor(shape=[True, 2])), TensorError, "holds True"),
    ("shape not list", request(tensor(shape=2)), TensorError, "'shape' must be a list"),
    (
        "too few values",
        request(tensor(shape=[3])),
        TensorError,
        "'data' holds 2 values but shape [3] needs 3",
    ),
    (
        "too many nested",
        request(tensor(shape=[1, 3], data=[[1, 2], [3, 4]])),
        TensorError,
        "holds 4 values",
    ),
    (
        "ragged",
        request(tensor(shape=[3], data=[[1, 2], [3]])),
        TensorError,
        "not a regular nested list",
    ),
    (
        "data not list",
        request(tensor(data=3.0)),
        TensorError,
        "'data' must be a (flat or nested) list",
    ),
    (
        "strings for FP32",
        request(tensor(data=["1", "2"])),
        TensorError,
        "FP32 'data' must hold numbers, found strings",
    ),
    ("null in data", request(tensor(data=[1, None])), TensorError, "must hold numbers"),
    (
        "floats for INT32",
        request(tensor(datatype="INT32", data=[1, 2.5])),
        TensorError,
        "must hold integers",
    ),
    (
        "bools for INT8",
        request(tensor(datatype="INT8", data=[True, False])),
        TensorError,
        "found booleans",
    ),
    (
        "out of range",
        request(tensor(datatype="UINT8", data=[1, 256])),
        TensorError,
        "value 256 is out of range for UINT8 [0, 255]",
    ),
    (
        "negative unsigned",
        request(tensor(datatype="UINT64", data=[-1, 2**64 - 1])),
        TensorError,
        "out of range for UINT64",
    ),
    (
        "numbers for BOOL",
        request(tensor(datatype="BOOL", data=[2, 0])),
        TensorError,
        "BOOL 'data' must hold true/false",
    ),
    (
        "numbers for BYTES",
        request(tensor(datatype="BYTES", data=["a", 1])),
        TensorError,
        "BYTES 'data' holds 1; expected strings",
    ),
    (
        "BYTES count",
        request(tensor(datatype="BYTES", data=[["a"]])),
        TensorError,
        "holds 1 values but shape [2] needs 2",
    ),
    (
        "no data",
        request(tensor(data=DROP)),
        TensorError,
        "has neither 'data' nor parameters.binary_data_size",
    ),
    (
        "both",
        request(tensor(parameters={"binary_data_size": 8})),
        TensorError,
        "has both 'data' and",
    ),
    (
        "binary without header",
        request(tensor(data=DROP, parameters={"binary_data_size": 8})),
        TensorError,
        f"no {HEADER_LENGTH} header",
    ),
    (
        "bad binary size",
        request(tensor(data=DROP, parameters={"binary_data_size": "8"})),
        TensorError,
        "binary_data_size must be an integer >= 0",
    ),
    (
        "shared memory",
        request(tensor(data=DROP, parameters={"shared_memory_region": "r"})),
        TensorError,
        "shared-memory tensors are not supported",
    ),
    ("duplicate input", request(tensor(), tensor()), InvalidRequest, "input 'x' appears twice"),
    (
        "outputs not list",
        request(tensor(), outputs={"y": 1}),
        InvalidRequest,
        "'outputs' must be a list",
    ),
    ("output without name", request(tensor(), outputs=[{}]), InvalidRequest, "requested output #0"),
    (
        "output twice",
        request(tensor(), outputs=[{"name": "y"}, {"name": "y"}]),
        InvalidRequest,
        "output 'y' is requested twice",
    ),
    (
        "classification",
        request(tensor(), outputs=[{"name": "y", "parameters": {"classification": 3}}]),
        InvalidRequest,
        "'classification', which tierlink does not support",
    ),
    (
        "binary_data not bool",
        request(tensor(), outputs=[{"name": "y", "parameters": {"binary_data": 1}}]),
        InvalidRequest,
        "binary_data must be true or false",
    ),
    (
        "empty tensor too big",
        request(tensor(shape=[0, 2**62, 2**62], data=[])),
        InvalidRequest,
        "malformed",
    ),
]


@pytest.mark.parametrize(
    "body, error, message", [c[1:] for c in JSON_CASES], ids=[c[0] for c in JSON_CASES]
)
def test_malformed_json_request_names_the_fault(
    body: bytes, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        decode_infer_request(body, None)
    assert message in str(caught.value)


FP32_BINARY = tensor(data=DROP, parameters={"binary_data_size": 8})
BINARY_CASES: list[tuple[str, bytes, int, str]] = [
    (
        "size vs shape",
        *binary(tensor(data=DROP, parameters={"binary_data_size": 4}), b"\0" * 4),
        "binary_data_size is 4 bytes but shape [2] of FP32 needs 8",
    ),
    (
        "truncated",
        *binary(FP32_BINARY, b"\0" * 5),
        "binary data is truncated: it declares 8 bytes but only 5",
    ),
    ("trailing", *binary(FP32_BINARY, b"\0" * 11), "3 trailing bytes"),
    (
        "bool not 0/1",
        *binary(
            tensor(datatype="BOOL", data=DROP, parameters={"binary_data_size": 2}), b"\x01\x07"
        ),
        "BOOL binary data holds bytes other than 0 and 1",
    ),
    (
        "bytes count",
        *binary(
            tensor(datatype="BYTES", data=DROP, parameters={"binary_data_size": 5}), b"\1\0\0\0a"
        ),
        "holds 1 elements but shape [2] needs 2",
    ),
    (
        "bytes overrun",
        *binary(
            tensor(datatype="BYTES", data=DROP, parameters={"binary_data_size": 6}), b"\x09\0\0\0ab"
        ),
        "BYTES element 0 declares 9 bytes but only 2 remain",
    ),
    (
        "bytes short prefix",
        *binary(
            tensor(datatype="BYTES", data=DROP, parameters={"binary_data_size": 7}),
            b"\1\0\0\0a\0\0",
        ),
        "BYTES element 1 has a truncated 4-byte length",
    ),
    (
        "bytes extra",
        *binary(
            tensor(shape=[1], datatype="BYTES", data=DROP, parameters={"binary_data_size": 9}),
            b"\1\0\0\0a\0\0\0\0",
        ),
        "holds more than the 1 elements",
    ),
]


@pytest.mark.parametrize(
    "body, length, message", [c[1:] for c in BINARY_CASES], ids=[c[0] for c in BINARY_CASES]
)
def test_malformed_binary_request_names_the_fault(body: bytes, length: int, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode_infer_request(body, length)
    assert message in str(caught.value)
    if "trailing" not in message:  # a fault of one tensor names it
        assert isinstance(caught.value, TensorError) and "input 'x'" in str(caught.value)


@pytest.mark.parametrize("length", [-1, 10_000])
def test_header_length_outside_body_is_refused(length: int) -> None:
    body = request(tensor())
    with pytest.raises(
        InvalidRequest, match=f"{HEADER_LENGTH} is {length} but the request body holds"
    ):
        decode_infer_request(body, length)


def test_malformed_response_is_an_invalid_request_too() -> None:
    with pytest.raises(InvalidRequest, match="response has no 'outputs' list"):
        decode_infer_response(b'{"model_name": "m"}', None)
    body = json.dumps({"outputs": [tensor(name="y", shape=[3])]}).encode()
    with pytest.raises(
        TensorError, match="output 'y': 'data' holds 2 values but shape \\[3\\] needs 3"
    ):
        decode_infer_response(body, None)


# ----------------------------------------------------------------------------- fuzz


def valid_bodies() -> list[tuple[bytes, int | None]]:
    """Valid request and response bodies exercising every path, as (body, header length)."""
    tensors = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "s": np.array([b"ab", b"", b"\xff"], dtype=object),
        "b": np.array([True, False]),
        "i": np.array([[-5, 7]], dtype=np.int64),
    }
    bodies = []
    for is_binary in (True, False):
        body, headers = encode_infer_request(tensors, {"k": "v"}, ["y"], is_binary, is_binary, "id")
        bodies.append((body, int(headers[HEADER_LENGTH]) if HEADER_LENGTH in headers else None))
        body, headers = encode_infer_response("m", "1", "id", tensors, None, is_binary)
        bodies.append((body, int(headers[HEADER_LENGTH]) if HEADER_LENGTH in headers else None))
    return bodies


def decode_both(body: bytes, length: int | None) -> None:
    """Decode as request and as response; only InvalidRequest (or success) is allowed."""
    for decode in (decode_infer_request, decode_infer_response):
        try:
            decode(body, length)
        except InvalidRequest as exc:
            assert str(exc)  # every refusal explains itself


def test_truncated_bodies_never_crash() -> None:
    for body, length in valid_bodies():
        for cut in range(len(body)):
            decode_both(body[:cut], length if length is not None and length <= cut else None)
            decode_both(body[:cut], length)


def test_random_and_mutated_bodies_never_crash() -> None:
    rng = random.Random(1234)
    bodies = valid_bodies()
    for _ in range(3000):
        body, length = rng.choice(bodies)
        mutated = bytearray(body)
        for _ in range(rng.randint(1, 8)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        cut = rng.choice([len(mutated), rng.randrange(len(mutated) + 1)])
        fuzz_length = rng.choice([length, None, rng.randrange(-2, len(mutated) + 4)])
        decode_both(bytes(mutated[:cut]), fuzz_length)
    for _ in range(500):
        noise = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        decode_both(noise, rng.choice([None, rng.randrange(-1, 70)]))


JSON_FRAGMENTS: list[Any] = [
    None,
    True,
    0,
    -1,
    1.5,
    2**70,
    "",
    "x",
    "FP32",
    "BYTES",
    [],
    {},
    [1, [2]],
    [[[]]],
    {"a": 1},
    float("nan"),
    [-1],
    [2**63],
    ["a", None],
    "NaN",
]


def test_structurally_random_json_never_crashes() -> None:
    # Valid JSON, every field a random value: exercises the validators, not the parser.
    rng = random.Random(99)
    keys = ["name", "shape", "datatype", "data", "parameters"]
    for _ in range(3000):
        entry = {k: rng.choice(JSON_FRAGMENTS) for k in keys if rng.random() < 0.8}
        if rng.random() < 0.5:
            entry["parameters"] = {"binary_data_size": rng.choice(JSON_FRAGMENTS + [0, 4, 8])}
        doc = {"inputs": [entry], "outputs": [entry], "parameters": rng.choice(JSON_FRAGMENTS)}
        head = json.dumps(doc).encode()
        decode_both(head + b"\0" * rng.randrange(12), len(head))
        decode_both(head, None)
