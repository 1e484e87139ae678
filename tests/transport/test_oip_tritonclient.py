"""Conformance with the stock tritonclient[http]: its requests decode, our responses parse.

Offline tests serialise with tritonclient's own request builder and parse with its own
``InferResult``; the wire test points ``tritonclient.http.InferenceServerClient`` at the tiny
loopback server in conftest.py, which speaks through tierlink's codec.
"""

from __future__ import annotations

import gzip
import zlib

import numpy as np
import pytest
from test_oip_codec import sample

from tierlink.transport.oip import (
    DATATYPES,
    HEADER_LENGTH,
    RequestedOutput,
    compress_body,
    decode_infer_request,
    encode_infer_response,
)

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.http._utils import _get_inference_request
from tritonclient.utils import InferenceServerException


def triton_request(inputs, outputs=None, parameters=None, request_id="", priority=0, timeout=None):
    """(body, json_size) exactly as tritonclient's InferenceServerClient.infer builds them."""
    return _get_inference_request(
        inputs=inputs,
        request_id=request_id,
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=priority,
        timeout=timeout,
        custom_parameters=parameters,
    )


def triton_input(name: str, arr: np.ndarray, binary: bool, datatype: str):
    return httpclient.InferInput(name, list(arr.shape), datatype).set_data_from_numpy(
        arr, binary_data=binary
    )


def as_wire_bytes(arr: np.ndarray) -> list[bytes]:
    return [x if isinstance(x, bytes) else str(x).encode() for x in arr.ravel()]


def assert_equal_exact(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert as_wire_bytes(got) == as_wire_bytes(want)
    else:
        assert got.dtype == want.dtype
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("datatype", DATATYPES)
def test_tritonclient_request_decodes_exactly(datatype: str) -> None:
    as_binary = sample(datatype, (2, 2, 3), seed=3)
    as_json = sample(datatype, (1, 5), seed=4)
    body, json_size = triton_request(
        [
            triton_input("bin", as_binary, True, datatype),
            triton_input("js", as_json, False, datatype),
        ],
        outputs=[
            httpclient.InferRequestedOutput("y", binary_data=True),
            httpclient.InferRequestedOutput("z", binary_data=False),
        ],
        parameters={"tier": "edge", "budget": 3},
        request_id="req-1",
        priority=2,
        timeout=5000,
    )
    request = decode_infer_request(body, json_size)
    assert request.id == "req-1"
    assert request.parameters == {"tier": "edge", "budget": 3, "priority": 2, "timeout": 5000}
    assert request.outputs == [RequestedOutput("y", True), RequestedOutput("z", False)]
    assert_equal_exact(request.inputs["bin"], as_binary)
    assert_equal_exact(request.inputs["js"], as_json)


@pytest.mark.parametrize("coding, compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_tritonclient_compressed_request_decodes(coding: str, compress) -> None:
    # tritonclient compresses the whole body and keeps Inference-Header-Content-Length as is.
    x = sample("FP32", (1, 1, 28, 28))
    body, json_size = triton_request([triton_input("x", x, True, "FP32")])
    request = decode_infer_request(compress(body), json_size, coding)
    assert request.binary_output_default is True  # no outputs named: tritonclient asks binary
    assert_equal_exact(request.inputs["x"], x)


@pytest.mark.parametrize("binary", [True, False, "mixed"])
def test_tritonclient_parses_our_response_exactly(binary: bool | str) -> None:
    outputs = {f"o_{dt}": sample(dt, (2, 3), seed=i) for i, dt in enumerate(DATATYPES)}
    which = set(list(outputs)[::2]) if binary == "mixed" else binary
    body, headers = encode_infer_response("m", "1", "r9", outputs, {"served_by": "edge-1"}, which)
    length = headers.get(HEADER_LENGTH)
    result = httpclient.InferResult.from_response_body(
        body, header_length=None if length is None else int(length)
    )
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("m", "1", "r9")
    assert response["parameters"] == {"served_by": "edge-1"}
    for name, tensor in outputs.items():
        assert_equal_exact(result.as_numpy(name), tensor)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_parses_our_compressed_response(coding: str) -> None:
    outputs = {"y": sample("FP32", (32, 10)), "s": sample("BYTES", (3,))}
    body, headers = encode_infer_response("m", None, None, outputs, None, {"y"})
    zipped, zheaders = compress_body(body, headers, coding)
    result = httpclient.InferResult.from_response_body(
        zipped,
        header_length=int(zheaders[HEADER_LENGTH]),
        content_encoding=zheaders["Content-Encoding"],
    )
    for name, tensor in outputs.items():
        assert_equal_exact(result.as_numpy(name), tensor)


@pytest.mark.integration
def test_tritonclient_over_the_wire(oip_server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{oip_server.port}", network_timeout=10.0)
    try:
        assert client.is_server_ready()
        x = sample("FP32", (4, 1, 28, 28))
        s = sample("BYTES", (2, 2))
        for kwargs in [
            {},
            {"request_compression_algorithm": "gzip", "response_compression_algorithm": "deflate"},
            {"request_compression_algorithm": "deflate", "response_compression_algorithm": "gzip"},
        ]:
            result = client.infer(
                "echo",
                [triton_input("x", x, True, "FP32"), triton_input("s", s, False, "BYTES")],
                outputs=[
                    httpclient.InferRequestedOutput("x"),
                    httpclient.InferRequestedOutput("s", binary_data=False),
                ],
                request_id="wire-1",
                **kwargs,
            )
            assert result.get_response()["id"] == "wire-1"
            assert_equal_exact(result.as_numpy("x"), x)
            assert_equal_exact(result.as_numpy("s"), s)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("busy", [triton_input("x", x, True, "FP32")])
        assert refused.value.status() == "429" and "queue full on edge-1" in refused.value.message()
    finally:
        client.close()
    sent = oip_server.received[-2]
    assert (
        sent.headers["content-encoding"] == "deflate" and sent.headers["accept-encoding"] == "gzip"
    )
