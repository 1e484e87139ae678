"""Request building and answer parsing of the application clients, without a network.

Answers are made by the node's and the control plane's own encoders
(``protocol.outcome_params``, ``oip.encode_infer_response``, ``async_requests``,
``StoredResult``), so a change on either side of the wire breaks these tests.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tierlink.client import wire
from tierlink.client.results import Accepted, ModelMetadata, TensorMetadata
from tierlink.core.types import Bill, Fallback, Outcome, Priority, Privacy, Tier
from tierlink.errors import (
    ConfigError,
    ControlPlaneError,
    InvalidRequest,
    ModelNotFound,
    NotEnrolled,
    TierlinkError,
    UpstreamError,
)
from tierlink.node import async_requests, protocol
from tierlink.transport import oip

BASE = "http://node:8000"
CONTROL = "http://control:9000"
IMAGE = np.arange(2 * 1 * 28 * 28, dtype=np.float32).reshape(2, 1, 28, 28) / 1000.0
OUTCOME = Outcome("edge-2", Tier.EDGE, "fmnist-medium", ("dev-1", "edge-2"), 0.8125,
                  escalations=1, fallbacks=(Fallback("edge-1", "timeout", "no answer"),),
                  timings_ms={"compute_ms": 1.5}, bill=Bill.of_compute(Tier.EDGE, 2.5e-7),
                  degraded="",
                  split="conv2/int8", model_version="3")
OUTPUTS: dict[str, np.ndarray] = {"probabilities": np.array([[0.1, 0.9], [0.7, 0.3]], np.float32),
           "label": np.array([1, 0], np.int64)}


def sent(call: wire.Call[Any]) -> oip.InferRequestData:
    """What a node would decode from the call's body."""
    header = oip.parse_header_length(call.headers.get(oip.HEADER_LENGTH))
    assert call.content is not None
    return oip.decode_infer_request(call.content, header)


def reply(status: int, body: bytes | dict[str, Any] | list[Any],
          headers: dict[str, str] | None = None) -> wire.Reply:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return wire.Reply(status, headers or {}, content)


def infer_reply(params: dict[str, Any], outputs: dict[str, np.ndarray] = OUTPUTS,
                name: str = "fmnist", version: str | None = None) -> wire.Reply:
    body, headers = oip.encode_infer_response(name, version, "r-1", outputs, params, True)
    return wire.Reply(200, headers, body)


# -- requests ---------------------------------------------------------------------------


def test_an_inference_request_is_binary_tensors_with_the_tierlink_parameters() -> None:
    opts = wire.InferOptions.make(deadline_ms=150, privacy="site", priority="realtime",
                                  request_id="r-1")
    call = wire.infer_call(BASE, "fmnist", {"input": IMAGE}, opts)
    assert (call.method, call.url, call.target) == ("POST", f"{BASE}/v2/models/fmnist/infer",
                                                    wire.NODE)
    data = sent(call)
    assert call.headers["Content-Type"] == oip.BINARY_CONTENT_TYPE  # binary tensors
    np.testing.assert_array_equal(data.inputs["input"], IMAGE)
    assert data.id == "r-1" and data.binary_output_default is True
    assert data.parameters == {protocol.DEADLINE: 150.0, protocol.PRIVACY: "site",
                               protocol.PRIORITY: "realtime"}
    # The node parses them into the request it routes.
    req = protocol.parse_request("fmnist", data.parameters, request_id="r-1", receiver="n",
                                 input_bytes=0)
    assert (req.deadline_ms, req.privacy, req.priority) == (150.0, Privacy.SITE,
                                                            Priority.REALTIME)


def test_unset_options_are_left_to_the_node() -> None:
    data = sent(wire.infer_call(BASE, "fmnist", {"input": IMAGE}, wire.InferOptions.make()))
    assert data.parameters == {}


def test_a_version_is_pinned_in_the_url_and_names_are_quoted() -> None:
    opts = wire.InferOptions.make(version="2 rc", outputs=["label"])
    call = wire.infer_call(BASE, "my/model", {"input": IMAGE}, opts)
    assert call.url == f"{BASE}/v2/models/my%2Fmodel/versions/2%20rc/infer"
    assert [o.name for o in sent(call).outputs] == ["label"]


def test_an_asynchronous_request_carries_the_nodes_async_parameter() -> None:
    assert wire.ASYNC == async_requests.ASYNC and wire.UPLINK == async_requests.UPLINK
    call = wire.submit_call(BASE, "fmnist", {"input": IMAGE}, wire.InferOptions.make())
    assert async_requests.is_async(sent(call).parameters)


def test_extra_parameters_travel_packed() -> None:
    opts = wire.InferOptions.make(parameters={"tierlink.label": [3, 4], "traceparent": "00-x"})
    data = sent(wire.infer_call(BASE, "fmnist", {"input": IMAGE}, opts))
    assert protocol.parse_labels(data.parameters, 2) == (3, 4)
    assert data.parameters["traceparent"] == "00-x"


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"privacy": "planet"}, "privacy"), ({"priority": "urgent"}, "priority"),
    ({"deadline_ms": 0}, "deadline_ms"), ({"deadline_ms": float("nan")}, "deadline_ms"),
    ({"timeout_s": -1}, "timeout_s"), ({"parameters": {"tierlink.async": True}}, "asynchronous"),
])
def test_a_bad_option_is_refused_before_sending(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequest, match=named):
        wire.InferOptions.make(**kwargs)


def test_inputs_by_name_and_the_single_input_of_a_model() -> None:
    assert list(wire.named_tensors({"input": [[1.0]]})["input"].shape) == [1, 1]
    with pytest.raises(InvalidRequest, match="empty"):
        wire.named_tensors({})
    spec = TensorMetadata("input", "FP32", (-1, 1, 28, 28))
    meta = ModelMetadata("m", "onnxruntime_onnx", ("1",), (spec,), ())
    assert wire.single_input(meta) == "input"
    two = ModelMetadata("m", "onnxruntime_onnx", ("1",), (spec, TensorMetadata("b", "FP32", ())),
                        ())
    with pytest.raises(InvalidRequest, match="2 inputs") as info:
        wire.single_input(two)
    assert "dict" in info.value.hint


# -- inference answers ------------------------------------------------------------------


def test_a_routed_answer_gives_the_outputs_and_the_nodes_outcome() -> None:
    params = {**protocol.outcome_params(OUTCOME, 12.5), wire.UPLINK: "down"}
    result = wire.parse_answer(infer_reply(params), url=BASE)
    np.testing.assert_array_equal(result["probabilities"], OUTPUTS["probabilities"])
    np.testing.assert_array_equal(result.outputs["label"], OUTPUTS["label"])
    assert result.routed and result.model_name == "fmnist" and result.request_id == "r-1"
    assert (result.served_by, result.tier, result.model, result.path) == (
        "edge-2", Tier.EDGE, "fmnist-medium", ("dev-1", "edge-2"))
    assert (result.confidence, result.escalations, result.cost_usd) == (0.8125, 1, 2.5e-7)
    assert result.fallbacks == OUTCOME.fallbacks
    assert (result.degraded, result.split_plan, result.model_version) == ("", "conv2/int8", "3")
    assert result.server_ms == 12.5 and dict(result.timings_ms) == {"compute_ms": 1.5}
    assert result.uplink == "down"
    assert result.parameters["tierlink.served_by"] == "edge-2"


def test_a_model_answer_has_no_outcome() -> None:
    params = {protocol.SERVER_MS: 1.25, protocol.MODEL_VERSION: "2"}
    result = wire.parse_answer(infer_reply(params, {"logits": IMAGE[:, 0, 0]}, "m", "2"),
                               url=BASE)
    assert not result.routed and result.served_by is None and result.tier is None
    assert (result.model_version, result.server_ms, result.path) == ("2", 1.25, ())
    assert result["logits"].shape == (2, 28)


def test_an_error_answer_raises_the_nodes_error_with_its_hint() -> None:
    err = ModelNotFound("no model or task 'nope' on edge-1", hint="models: ['m']")
    with pytest.raises(ModelNotFound) as info:
        wire.parse_answer(reply(404, oip.error_body(err)), url=f"{BASE}/v2/models/nope/infer")
    assert info.value.code == "model_not_found" and info.value.hint == "models: ['m']"
    assert info.value.message == "no model or task 'nope' on edge-1"
    assert info.value.details == {"url": f"{BASE}/v2/models/nope/infer", "status": 404}


def test_an_answer_without_a_tierlink_body_is_still_a_tierlink_error() -> None:
    with pytest.raises(UpstreamError, match="HTTP 502: bad gateway"):
        wire.parse_answer(reply(502, b"bad gateway"), url=BASE)
    with pytest.raises(InvalidRequest, match="HTTP 422"):
        wire.parse_answer(reply(422, {"detail": "unprocessable"}), url=BASE)


@pytest.mark.parametrize("body", [b"not json", b'{"outputs": 3}', b"[]"])
def test_a_malformed_answer_is_an_upstream_error(body: bytes) -> None:
    with pytest.raises(UpstreamError, match="malformed inference answer"):
        wire.parse_answer(reply(200, body), url=BASE)


def test_a_routed_answer_with_an_unreadable_outcome_is_an_upstream_error() -> None:
    params = {**protocol.outcome_params(OUTCOME, 1.0), "tierlink.path": "{oops"}
    with pytest.raises(UpstreamError, match="malformed"):
        wire.parse_answer(infer_reply(params), url=BASE)


def test_the_202_answer_of_an_asynchronous_request() -> None:
    body = async_requests.accepted_body("r-9", "dev-1:r-9", "down")
    accepted = wire.parse_accepted(reply(202, body), url=BASE, name="fmnist")
    assert accepted == Accepted("r-9", "dev-1:r-9", "down")


def test_a_model_answering_an_asynchronous_request_at_once_is_refused() -> None:
    answer = infer_reply({protocol.SERVER_MS: 1.0}, name="m")
    with pytest.raises(InvalidRequest, match="only a task") as info:
        wire.parse_accepted(answer, url=BASE, name="m")
    assert "task" in info.value.hint


# -- other calls ------------------------------------------------------------------------


def test_metadata_and_index() -> None:
    call = wire.metadata_call(BASE, "fmnist-small", "2")
    assert call.url == f"{BASE}/v2/models/fmnist-small/versions/2"
    doc = {"name": "fmnist-small", "versions": ["1", "2"], "platform": "onnxruntime_onnx",
           "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
           "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
           "parameters": {"task": "fmnist"}}
    meta = call.parse(reply(200, doc))
    assert meta.inputs == (TensorMetadata("input", "FP32", (-1, 1, 28, 28)),)
    assert meta.versions == ("1", "2") and meta.parameters["task"] == "fmnist"
    index = wire.index_call(BASE)
    assert (index.method, index.url) == ("POST", f"{BASE}/v2/repository/index")
    rows = index.parse(reply(200, [{"name": "m", "version": "1", "state": "READY"},
                                   {"name": "t", "version": "", "state": "READY",
                                    "reason": "routed task"}]))
    assert [(r.name, r.reason) for r in rows] == [("m", ""), ("t", "routed task")]
    with pytest.raises(UpstreamError, match="malformed model metadata"):
        call.parse(reply(200, {"inputs": []}))


def test_ready_is_true_only_on_200() -> None:
    call = wire.ready_call(BASE)
    assert call.url == f"{BASE}/v2/health/ready"
    assert call.parse(reply(200, {"ready": True}))
    assert not call.parse(reply(503, {"ready": False}))


# -- results of asynchronous requests ---------------------------------------------------


def stored_row(key: str = "dev-1:r-9") -> dict[str, Any]:
    from tierlink.control.results import StoredResult

    payload = async_requests.build_result_payload(
        "r-9", "fmnist", OUTPUTS, OUTCOME, 4.5, node_id="dev-1", uplink="up",
        answered_at=1000.0)
    return StoredResult(7, key, "result", "dev-1", ("dev-1", "edge-1"), "edge-1", payload,
                        1000.0, 1001.5).to_dict()


def test_results_are_read_from_the_control_plane_as_an_operator() -> None:
    call = wire.result_call(CONTROL, Accepted("r-9", "dev-1:r-9", "up"), "s3cret")
    assert (call.method, call.url, call.target) == ("GET", f"{CONTROL}/v1/results/dev-1:r-9",
                                                    wire.CONTROL)
    assert call.headers == {"Authorization": "Bearer admin:s3cret"}
    assert wire.result_call(CONTROL, "a b:c", None).url == f"{CONTROL}/v1/results/a%20b:c"
    assert wire.result_call(CONTROL, "k", None).headers == {}


def test_reading_results_needs_a_control_url() -> None:
    with pytest.raises(ConfigError, match="control_url"):
        wire.result_call(None, "dev-1:r-9", None)


def test_a_stored_result() -> None:
    result = wire.result_call(CONTROL, "dev-1:r-9", None).parse(reply(200, stored_row()))
    assert result is not None
    assert (result.key, result.request_id, result.task, result.node) == (
        "dev-1:r-9", "r-9", "fmnist", "dev-1")
    assert (result.served_by, result.tier, result.model, result.model_version) == (
        "edge-2", Tier.EDGE, "fmnist-medium", "3")
    assert result.predictions == (1, 0)
    assert result.confidences == pytest.approx((0.9, 0.7))
    assert (result.escalations, result.fallbacks, result.split_plan) == (
        1, OUTCOME.fallbacks, "conv2/int8")
    assert (result.latency_ms, result.cost_usd, result.uplink) == (4.5, 2.5e-7, "up")
    assert (result.answered_at, result.received_at) == (1000.0, 1001.5)
    assert result.chain == ("dev-1", "edge-1") and result.path == ("dev-1", "edge-2")


def test_a_result_not_arrived_yet_is_none_and_other_errors_raise() -> None:
    parse = wire.result_call(CONTROL, "k", None).parse
    missing = {"error": "no result with key 'k' has arrived (yet)", "code": "result_not_found"}
    assert parse(reply(404, missing)) is None
    refused = {"error": "missing credentials", "code": "not_enrolled", "hint": "enroll"}
    with pytest.raises(NotEnrolled):
        parse(reply(401, refused))
    with pytest.raises(ControlPlaneError, match="malformed stored result"):
        parse(reply(200, {"key": "k", "payload": {}}))


def test_every_error_is_a_tierlink_error() -> None:
    for status in (400, 403, 404, 429, 500, 503, 504):
        with pytest.raises(TierlinkError):
            wire.parse_answer(reply(status, b""), url=BASE)
