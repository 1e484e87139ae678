"""Client and AsyncClient over httpx's MockTransport (a scripted node and control plane in
process), and against a loopback port nothing listens on: what they send, what they
return, and which tierlink error each failure becomes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink import AsyncClient, Client
from tierlink.client.results import Accepted
from tierlink.core.types import Outcome, Tier
from tierlink.errors import (
    ConfigError,
    ControlPlaneError,
    InvalidRequest,
    ModelNotFound,
    TierlinkError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from tierlink.netports import pick_port
from tierlink.node import async_requests, protocol
from tierlink.transport import oip

NODE = "http://node.test"
CONTROL = "http://control.test"
X = np.full((1, 1, 28, 28), 0.5, np.float32)
OUTCOME = Outcome("edge-1", Tier.EDGE, "fmnist-medium", ("edge-1",), 0.75)
METADATA = {"name": "fmnist", "versions": [], "platform": "tierlink_router",
            "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
            "outputs": [], "parameters": {"routed": True}}


class FakeFleet:
    """A node serving the task ``fmnist`` (input ``image``) and a control plane whose
    result for ``edge-1:r-1`` arrives on the ``arrives_after``-th read."""

    def __init__(self, arrives_after: int = 1) -> None:
        self.seen: list[httpx.Request] = []
        self.arrives_after = arrives_after

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        path = request.url.path
        if request.url.host == "control.test":
            return self._result(request)
        if path == "/v2/models/fmnist":
            return httpx.Response(200, json=METADATA)
        if path == "/v2/models/fmnist/infer":
            return self._infer(request)
        err = ModelNotFound(f"no model or task at {path}", hint="models: []; tasks: ['fmnist']")
        return httpx.Response(404, content=oip.error_body(err))

    def paths(self) -> list[str]:
        return [r.url.path for r in self.seen]

    def _infer(self, request: httpx.Request) -> httpx.Response:
        header = oip.parse_header_length(request.headers.get(oip.HEADER_LENGTH))
        data = oip.decode_infer_request(request.content, header)
        if async_requests.is_async(data.parameters):
            accepted = async_requests.accepted_body("r-1", "edge-1:r-1", "up")
            return httpx.Response(202, json=accepted)
        probs = np.full((len(data.inputs["image"]), 10), 0.1, np.float32)
        params = protocol.outcome_params(OUTCOME, 2.0)
        body, headers = oip.encode_infer_response("fmnist", None, data.id,
                                                  {"probabilities": probs}, params, True)
        return httpx.Response(200, content=body, headers=headers)

    def _result(self, request: httpx.Request) -> httpx.Response:
        reads = sum(1 for r in self.seen if r.url.host == "control.test")
        if reads < self.arrives_after:
            return httpx.Response(404, json={"error": "not yet", "code": "result_not_found"})
        payload = async_requests.build_result_payload(
            "r-1", "fmnist", {"probabilities": np.array([[0.25, 0.75]])}, OUTCOME, 3.0,
            node_id="edge-1", uplink="up", answered_at=10.0)
        return httpx.Response(200, json={"seq": 1, "key": "edge-1:r-1", "kind": "result",
                                         "origin": "edge-1", "chain": ["edge-1"],
                                         "sender": "edge-1", "payload": payload,
                                         "created_at": 10.0, "received_at": 11.0})


def sync_client(handler: Callable[[httpx.Request], httpx.Response], **kwargs: Any) -> Client:
    return Client(NODE, control_url=CONTROL, transport=httpx.MockTransport(handler), **kwargs)


def async_client(handler: Callable[[httpx.Request], httpx.Response],
                 **kwargs: Any) -> AsyncClient:
    return AsyncClient(NODE, control_url=CONTROL, transport=httpx.MockTransport(handler),
                       **kwargs)


def failing(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


# -- sync ---------------------------------------------------------------------------------


def test_an_array_is_sent_as_the_models_single_input_named_once() -> None:
    fleet = FakeFleet()
    with sync_client(fleet) as client:
        first = client.infer("fmnist", X, deadline_ms=100)
        client.infer("fmnist", np.concatenate([X, X]))
    assert fleet.paths() == ["/v2/models/fmnist", "/v2/models/fmnist/infer",
                             "/v2/models/fmnist/infer"]  # metadata read once
    assert first.served_by == "edge-1" and first.tier is Tier.EDGE
    assert first["probabilities"].shape == (1, 10)


def test_a_dict_of_inputs_needs_no_metadata() -> None:
    fleet = FakeFleet()
    with sync_client(fleet) as client:
        client.infer("fmnist", {"image": X})
    assert fleet.paths() == ["/v2/models/fmnist/infer"]


def test_the_node_is_sent_binary_tensors_without_compression() -> None:
    fleet = FakeFleet()
    with sync_client(fleet) as client:
        client.infer("fmnist", {"image": X}, privacy="local")
    request = fleet.seen[0]
    assert request.headers["Content-Type"] == oip.BINARY_CONTENT_TYPE
    assert request.headers["Accept-Encoding"] == "identity"
    assert "authorization" not in request.headers  # the admin token is for the control plane


def test_an_asynchronous_request_and_its_result_read_as_an_operator() -> None:
    fleet = FakeFleet(arrives_after=3)
    with sync_client(fleet, admin_token="tok") as client:
        accepted = client.infer("fmnist", {"image": X}, asynchronous=True)
        assert accepted == Accepted("r-1", "edge-1:r-1", "up")
        assert client.result(accepted) is None  # not arrived yet: no waiting asked
        result = client.result(accepted, wait_s=5.0, poll_s=0.01)
    assert result is not None and result.predictions == (1,) and result.node == "edge-1"
    reads = [r for r in fleet.seen if r.url.host == "control.test"]
    assert len(reads) == 3
    assert all(r.headers["authorization"] == "Bearer admin:tok" for r in reads)
    assert reads[0].url.path == "/v1/results/edge-1:r-1"


def test_waiting_for_a_result_gives_up_after_wait_s() -> None:
    with sync_client(FakeFleet(arrives_after=10**6)) as client:
        assert client.result("edge-1:r-1", wait_s=0.05, poll_s=0.01) is None


def test_metadata_models_ready_and_an_unknown_name() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v2/repository/index":
            return httpx.Response(200, json=[{"name": "fmnist", "version": "",
                                              "state": "READY", "reason": "routed task"}])
        if request.url.path == "/v2/health/ready":
            return httpx.Response(503, json={"ready": False})
        return FakeFleet()(request)

    with sync_client(handler) as client:
        assert client.metadata("fmnist").inputs[0].name == "image"
        assert [m.name for m in client.models()] == ["fmnist"]
        assert client.ready() is False
        with pytest.raises(ModelNotFound) as info:
            client.infer("nope", X)
    assert info.value.hint == "models: []; tasks: ['fmnist']"
    assert info.value.details["url"] == f"{NODE}/v2/models/nope"


@pytest.mark.parametrize(("exc", "expected"), [
    (httpx.ConnectError("refused"), UpstreamUnavailable),
    (httpx.RemoteProtocolError("peer closed"), UpstreamUnavailable),
    (httpx.ReadTimeout("slow"), UpstreamTimeout),
])
def test_a_failed_exchange_with_the_node_is_a_tierlink_error(
        exc: Exception, expected: type[TierlinkError]) -> None:
    with sync_client(failing(exc)) as client:
        with pytest.raises(expected) as info:
            client.infer("fmnist", {"image": X})
        assert client.ready() is False
    assert info.value.details["url"] == f"{NODE}/v2/models/fmnist/infer"
    assert isinstance(info.value.__cause__, httpx.HTTPError)


def test_a_failed_exchange_with_the_control_plane_is_a_control_plane_error() -> None:
    client = sync_client(failing(httpx.ConnectError("refused")))
    with client, pytest.raises(ControlPlaneError, match="/v1/results/k"):
        client.result("k")


def test_a_refused_loopback_connection() -> None:
    url = f"http://127.0.0.1:{pick_port()}"  # free now: nothing listens there
    with Client(url, timeout_s=5.0) as client:
        assert client.ready() is False
        with pytest.raises(UpstreamUnavailable) as info:
            client.infer("fmnist", {"input": X})
    assert "tierlink node" in info.value.hint


def test_results_need_a_control_url() -> None:
    client = Client(NODE, transport=httpx.MockTransport(FakeFleet()))
    with client, pytest.raises(ConfigError, match="control_url"):
        client.result("k")


@pytest.mark.parametrize("url", ["node:8000", "ftp://node", "http://", 42])
def test_a_bad_url_is_a_config_error(url: Any) -> None:
    with pytest.raises(ConfigError):
        Client(url)


def test_a_bad_option_is_refused_without_a_request() -> None:
    fleet = FakeFleet()
    with sync_client(fleet) as client, pytest.raises(InvalidRequest, match="privacy"):
        client.infer("fmnist", {"image": X}, privacy="planet")
    assert fleet.seen == []


def test_a_closed_client_says_so() -> None:
    client = sync_client(FakeFleet())
    client.close()
    with pytest.raises(TierlinkError, match="closed"):
        client.infer("fmnist", {"image": X})


# -- async --------------------------------------------------------------------------------


def test_the_async_client_does_the_same() -> None:
    fleet = FakeFleet(arrives_after=2)

    async def scenario() -> None:
        async with async_client(fleet, admin_token="tok") as client:
            answers = await asyncio.gather(*(client.infer("fmnist", X, priority="batch")
                                             for _ in range(3)))
            assert all(a.served_by == "edge-1" for a in answers)
            accepted = await client.infer("fmnist", X, asynchronous=True)
            result = await client.result(accepted.result_key, wait_s=5.0, poll_s=0.01)
            assert result is not None and result.served_by == "edge-1"
            assert (await client.metadata("fmnist")).platform == "tierlink_router"
        assert asyncio.all_tasks() == {asyncio.current_task()}, "tasks leaked"

    asyncio.run(scenario())
    sent = [json.loads(r.content[: int(r.headers[oip.HEADER_LENGTH])])
            for r in fleet.seen if r.url.path.endswith("/infer")]
    assert sent[0]["parameters"][protocol.PRIORITY] == "batch"


def test_the_async_client_maps_failures_too() -> None:
    async def scenario() -> None:
        async with async_client(failing(httpx.ConnectError("refused"))) as client:
            assert await client.ready() is False
            with pytest.raises(UpstreamUnavailable):
                await client.infer("fmnist", {"image": X})
            with pytest.raises(ControlPlaneError):
                await client.result("k")
        with pytest.raises(TierlinkError, match="closed"):
            await client.models()

    asyncio.run(scenario())
