"""The Open Inference Protocol's gRPC messages: the same fields as the protocol's own
(``tritonclient``'s copy of the service), and tensors and parameters through the codec as
through the REST codec — checked alike."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tierlink.errors import InvalidRequest, TensorError
from tierlink.transport import grpc_codec as codec
from tierlink.transport.proto import messages

PROTO_DIR = Path(codec.__file__).parent / "proto"
pb = messages()
triton_pb = pytest.importorskip("tritonclient.grpc.service_pb2")


def fields(descriptor: Any) -> dict[str, tuple[int, int, str]]:
    """name -> (number, type, type of a message field), nested messages too."""
    out = {f.name: (f.number, f.type, f.message_type.name if f.message_type else "")
           for f in descriptor.fields}
    for nested in descriptor.nested_types:
        if not nested.GetOptions().map_entry:
            out |= {f"{nested.name}.{k}": v for k, v in fields(nested).items()}
    return out


@pytest.mark.parametrize("method", sorted(codec.METHODS))
def test_each_message_has_the_protocols_fields(method: str) -> None:
    """Field numbers and types as the protocol's (what is on the wire); Triton's copy may
    have more fields than the protocol, never different ones."""
    for ours in codec.method_types(method):
        theirs = getattr(triton_pb, ours.DESCRIPTOR.name).DESCRIPTOR
        mine, triton = fields(ours.DESCRIPTOR), fields(theirs)
        assert {k: triton[k] for k in mine} == mine


def test_parameters_and_contents_messages_match_too() -> None:
    for name in ("InferParameter", "InferTensorContents"):
        mine = fields(getattr(pb, name).DESCRIPTOR)
        triton = fields(getattr(triton_pb, name).DESCRIPTOR)
        assert {k: triton[k] for k in mine} == mine


def proto_fields(text: str) -> dict[str, dict[str, int]]:
    """Each message of a .proto file (nested ones by their own name) and its fields'
    numbers, read from the text."""
    out: dict[str, dict[str, int]] = {}
    stack: list[str] = []
    code = re.sub(r"//[^\n]*", "", text)
    for token in re.findall(r"message \w+ \{|oneof \w+ \{|\}|[^{};]+;", code):
        if token.startswith("message "):
            stack.append(token.split()[1])
            out[stack[-1]] = {}
        elif token.startswith("oneof "):
            stack.append(stack[-1])  # its fields are the message's
        elif token == "}":
            stack.pop()
        elif m := re.search(r"(\w+) = (\d+);$", token.strip()):
            out[stack[-1]][m[1]] = int(m[2])
    return out


def test_the_committed_descriptor_is_the_protos() -> None:
    """oip_v2.desc (what tierlink loads) says what oip_v2.proto (what people read) says."""
    text = proto_fields((PROTO_DIR / "oip_v2.proto").read_text())

    def walk(descriptor: Any) -> Iterator[tuple[str, dict[str, int]]]:
        yield descriptor.name, {f.name: f.number for f in descriptor.fields}
        for nested in descriptor.nested_types:
            if not nested.GetOptions().map_entry:
                yield from walk(nested)

    loaded = dict(kv for name in vars(pb) for kv in walk(getattr(pb, name).DESCRIPTOR))
    assert loaded == text, "oip_v2.desc is stale: remake it (oip_v2.proto says how)"


def test_a_request_round_trips_with_several_tensors_and_parameters() -> None:
    inputs = {"image": np.arange(12, dtype=np.float32).reshape(2, 1, 2, 3),
              "mask": np.array([[True, False]]), "words": np.array([b"a", b"bc"], object)}
    params = {"tierlink.deadline_ms": 50, "tierlink.privacy": "local", "x": 0.5,
              "flag": True, "path": ["a", "b"]}
    msg = pb.ModelInferRequest.FromString(
        codec.encode_request("m", inputs, params, request_id="r1").SerializeToString())
    data = codec.decode_request(msg)
    assert data.id == "r1" and set(data.inputs) == set(inputs)
    for name, arr in inputs.items():
        np.testing.assert_array_equal(data.inputs[name], arr)
    assert data.parameters == {**params, "path": '["a","b"]'}  # JSON text, as over REST
    assert data.binary_output_default


def test_typed_contents_are_read_and_checked_like_json_data() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="x", datatype="FP32", shape=[2, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(codec.decode_request(msg).inputs["x"],
                                  np.array([[1, 2], [3, 4]], np.float32))
    tensor.contents.fp32_contents.append(5.0)
    with pytest.raises(TensorError, match="holds 5 values but shape"):
        codec.decode_request(msg)


@pytest.mark.parametrize(("change", "error", "says"), [
    (lambda m: m.raw_input_contents.append(b"\0" * 8), InvalidRequest, "raw_input_contents"),
    (lambda m: setattr(m.inputs[0], "datatype", "FP33"), TensorError, "unknown datatype"),
    (lambda m: m.raw_input_contents.__setitem__(0, b"\0" * 7), TensorError, "needs 16"),
    (lambda m: (m.inputs.add().CopyFrom(m.inputs[0]),
                m.raw_input_contents.append(m.raw_input_contents[0])),
     InvalidRequest, "appears twice"),
])
def test_a_malformed_request_is_refused_naming_the_problem(change: Any, error: type,
                                                          says: str) -> None:
    msg = codec.encode_request("m", {"x": np.zeros((2, 2), np.float32)})
    change(msg)
    with pytest.raises(error, match=says):
        codec.decode_request(msg)


def test_a_request_without_inputs_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="no inputs"):
        codec.decode_request(pb.ModelInferRequest(model_name="m"))


def test_a_response_round_trips() -> None:
    outputs = {"probabilities": np.full((1, 3), 0.25, np.float32),
               "label": np.array([2], np.int64)}
    msg = codec.encode_response("t", None, "r", outputs, {"tierlink.served_by": "edge-1",
                                                          "tierlink.latency_ms": 3.5})
    back = codec.decode_response(pb.ModelInferResponse.FromString(msg.SerializeToString()))
    assert (back.model_name, back.model_version, back.id) == ("t", None, "r")
    for name, arr in outputs.items():
        np.testing.assert_array_equal(back.outputs[name], arr)
    assert back.parameters == {"tierlink.served_by": "edge-1", "tierlink.latency_ms": 3.5}


def test_a_failed_call_is_rebuilt_as_the_error_the_server_answered() -> None:
    from tierlink.errors import (
        AdmissionRefused,
        InvalidRequest,
        ModelNotFound,
        UpstreamTimeout,
        UpstreamUnavailable,
    )
    from tierlink.transport.grpc_client import _error

    err = _error("n:1", "ModelInfer", "INVALID_ARGUMENT",
                 "invalid_request: tierlink.privacy must be one of local, site, any "
                 "(hint: fix it)")
    assert type(err) is InvalidRequest and err.hint == "fix it"
    assert "tierlink.privacy" in err.message and err.details["grpc_status"] == "INVALID_ARGUMENT"
    assert type(_error("n:1", "ModelInfer", "RESOURCE_EXHAUSTED",
                       "admission_refused: the queue is full")) is AdmissionRefused
    assert type(_error("n:1", "ModelInfer", "NOT_FOUND", "no model 'x'")) is ModelNotFound
    assert type(_error("n:1", "ModelInfer", "UNAVAILABLE", "connect failed")) \
        is UpstreamUnavailable
    assert type(_error("n:1", "ModelInfer", "DEADLINE_EXCEEDED", "Deadline Exceeded")) \
        is UpstreamTimeout
