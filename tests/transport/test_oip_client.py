"""OipClient against a real loopback server (conftest.py), some answers scripted per test:
tensors round-trip, and every failure is mapped to the right tierlink error carrying the url."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiohttp
import numpy as np
import pytest

from tierlink.errors import (
    AdmissionRefused,
    InvalidRequest,
    ModelNotFound,
    RuntimeFailure,
    TierlinkError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from tierlink.transport.client import OipClient
from tierlink.transport.oip import pack_param

T = TypeVar("T")

IMAGE = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
TOKENS = np.array([[b"hello", "w\u00f6rld".encode()]], dtype=object)


def run(scenario: Callable[[OipClient], Awaitable[T]], **client_kwargs: Any) -> T:
    """Run ``scenario`` with a fresh client in a fresh loop; check nothing is left running."""

    async def main() -> T:
        async with OipClient(**client_kwargs) as client:
            result = await scenario(client)
        assert asyncio.all_tasks() == {asyncio.current_task()}, "tasks leaked"
        return result

    return asyncio.run(main())


def raised(scenario: Callable[[OipClient], Awaitable[Any]], **client_kwargs: Any) -> TierlinkError:
    with pytest.raises(TierlinkError) as caught:
        run(scenario, **client_kwargs)
    return caught.value


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_round_trips_tensors(oip_server, binary: bool) -> None:
    async def scenario(client: OipClient):
        return await client.infer(
            oip_server.url,
            "echo",
            {"image": IMAGE, "tokens": TOKENS},
            parameters={"trace": "t-1", "path": pack_param(["dev-1"])},
            binary=binary,
            headers={"X-Deadline-Ms": "50"},
            request_id="r-1",
        )

    response = run(scenario)
    assert (response.model_name, response.id) == ("echo", "r-1")
    assert response.parameters == {"trace": "t-1", "path": '["dev-1"]'}
    assert response.outputs["image"].dtype == np.float32
    assert response.outputs["image"].tobytes() == IMAGE.tobytes()
    assert response.outputs["tokens"].tolist() == TOKENS.tolist()
    sent = oip_server.received[-1]
    assert sent.headers["x-deadline-ms"] == "50"
    assert sent.headers["accept-encoding"] == "identity"
    assert ("inference-header-content-length" in sent.headers) == binary


def test_infer_selects_version_and_outputs(oip_server) -> None:
    async def scenario(client: OipClient):
        return await client.infer(
            oip_server.url + "/", "echo", {"a": IMAGE, "b": TOKENS}, version="3", outputs=["b"]
        )

    response = run(scenario)
    assert response.model_version == "3" and list(response.outputs) == ["b"]
    assert oip_server.received[-1].path == "/v2/models/echo/versions/3/infer"


def test_calls_reuse_one_pooled_connection(oip_server) -> None:
    async def scenario(client: OipClient) -> None:
        for _ in range(5):
            await client.infer(oip_server.url, "echo", {"x": IMAGE})
        assert await client.ready(oip_server.url)

    run(scenario)
    assert oip_server.connections == 1


def test_a_call_given_up_leaves_its_connection_pooled(oip_server) -> None:
    """A caller that stops waiting (a hedge's loser, cancelled) does not cost the
    connection: the answer is read and dropped, and the next call reuses it."""

    async def scenario(client: OipClient) -> None:
        assert await client.ready(oip_server.url)  # one warm connection
        call = asyncio.ensure_future(client.infer(oip_server.url, "lazy", {"x": IMAGE}))
        await asyncio.sleep(oip_server.lazy_s / 4)  # sent, not answered yet
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(oip_server.lazy_s * 1.5)  # the dropped answer has come back
        await client.infer(oip_server.url, "echo", {"x": IMAGE})

    run(scenario)
    assert oip_server.connections == 1
    assert [r.path for r in oip_server.received][-2:] == ["/v2/models/lazy/infer",
                                                          "/v2/models/echo/infer"]


def test_closing_ends_a_call_nobody_waits_for(oip_server) -> None:
    """``close`` does not wait for an abandoned call's answer (nor leave it running)."""

    async def scenario(client: OipClient) -> None:
        call = asyncio.ensure_future(client.infer(oip_server.url, "slow", {"x": IMAGE}))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    run(scenario)  # the server answers "slow" only when it stops: close did not wait


def test_ready_and_metadata(oip_server) -> None:
    async def scenario(client: OipClient):
        return await client.ready(oip_server.url), await client.model_metadata(
            oip_server.url, "echo"
        )

    ready, meta = run(scenario)
    assert ready is True and meta["name"] == "echo"


def test_ready_is_false_when_nobody_listens(closed_port_url: str) -> None:
    async def scenario(client: OipClient) -> bool:
        return await client.ready(closed_port_url)

    assert run(scenario) is False


def test_admission_refused_is_rebuilt_from_the_error_body(oip_server) -> None:
    err = raised(lambda c: c.infer(oip_server.url, "busy", {"x": IMAGE}))
    assert isinstance(err, AdmissionRefused) and err.http_status == 429
    assert err.message == "queue full on edge-1"
    assert err.details == {
        "node": "edge-1",
        "queue": 64,
        "url": f"{oip_server.url}/v2/models/busy/infer",
        "status": 429,
    }


def test_unknown_model_is_rebuilt_as_model_not_found(oip_server) -> None:
    err = raised(lambda c: c.model_metadata(oip_server.url, "nope"))
    assert (
        isinstance(err, ModelNotFound) and err.details["url"] == f"{oip_server.url}/v2/models/nope"
    )


def test_error_without_json_body_is_an_upstream_error_with_the_status(oip_server) -> None:
    err = raised(lambda c: c.infer(oip_server.url, "crash", {"x": IMAGE}))
    assert type(err) is UpstreamError and err.details["status"] == 500 and "boom" in err.message


def test_malformed_success_body_is_an_upstream_error(oip_server) -> None:
    err = raised(lambda c: c.infer(oip_server.url, "garbage", {"x": IMAGE}))
    assert type(err) is UpstreamError and "malformed inference response" in err.message
    assert err.details["url"].endswith("/v2/models/garbage/infer")


def test_slow_upstream_times_out(oip_server) -> None:
    err = raised(lambda c: c.infer(oip_server.url, "slow", {"x": IMAGE}, timeout_s=0.2))
    assert isinstance(err, UpstreamTimeout) and err.http_status == 504
    assert err.details["timeout_s"] == 0.2 and err.details["url"].endswith("/slow/infer")


def test_default_timeout_applies_when_the_call_gives_none(oip_server) -> None:
    err = raised(lambda c: c.infer(oip_server.url, "slow", {"x": IMAGE}), timeout_s=0.2)
    assert isinstance(err, UpstreamTimeout)


def test_spent_deadline_is_a_timeout_without_sending(oip_server) -> None:
    err = raised(lambda c: c.infer(oip_server.url, "echo", {"x": IMAGE}, timeout_s=0.0))
    assert isinstance(err, UpstreamTimeout) and "not sent" in err.message
    assert oip_server.received == []


def test_hang_up_is_upstream_unavailable(oip_server) -> None:
    err = raised(lambda c: c.infer(oip_server.url, "hangup", {"x": IMAGE}))
    assert isinstance(err, UpstreamUnavailable)
    assert err.details["url"] == f"{oip_server.url}/v2/models/hangup/infer"
    assert isinstance(err.__cause__, aiohttp.ServerDisconnectedError)


def test_connection_refused_is_upstream_unavailable(closed_port_url: str) -> None:
    url = closed_port_url
    err = raised(lambda c: c.infer(url, "echo", {"x": IMAGE}))
    assert isinstance(err, UpstreamUnavailable) and err.http_status == 503
    assert err.details["url"] == f"{url}/v2/models/echo/infer"
    assert isinstance(err.__cause__, aiohttp.ClientConnectorError)


def test_unencodable_input_is_refused_before_sending() -> None:
    with pytest.raises(InvalidRequest, match="pack_param"):
        run(lambda c: c.infer("http://127.0.0.1:9", "m", {"x": IMAGE}, parameters={"p": [1]}))


# ----------------------------------------------------------------------------- scripted


JSON = {"Content-Type": "application/json"}


def test_upstream_error_codes_map_to_their_classes(oip_server) -> None:
    body = {
        "error": "model crashed",
        "code": "runtime_failure",
        "details": {"hint": "x", "message": "y", "n": 1},
    }
    oip_server.replies["/v2/models/m/infer"] = (500, JSON, json.dumps(body).encode())
    err = raised(lambda c: c.infer(oip_server.url, "m", {"x": IMAGE}))
    # Colliding detail keys from a remote are dropped instead of breaking the rebuild.
    assert isinstance(err, RuntimeFailure) and err.details == {
        "n": 1,
        "url": f"{oip_server.url}/v2/models/m/infer",
        "status": 500,
    }


def test_plain_oip_error_without_code_maps_by_status(oip_server) -> None:
    # Triton answers {"error": msg} only.
    oip_server.replies["/v2/models/m/infer"] = (400, JSON, b'{"error": "bad shape"}')
    err = raised(lambda c: c.infer(oip_server.url, "m", {"x": IMAGE}))
    assert isinstance(err, InvalidRequest) and err.message == "bad shape"
    oip_server.replies["/v2/models/m/infer"] = (503, JSON, b'{"error": "not ready"}')
    err = raised(lambda c: c.infer(oip_server.url, "m", {"x": IMAGE}))
    assert type(err) is UpstreamError


def test_a_body_cut_short_is_upstream_unavailable(oip_server) -> None:
    oip_server.truncated["/v2/models/m/infer"] = (b'{"outputs"', 400)
    err = raised(lambda c: c.infer(oip_server.url, "m", {"x": IMAGE}))
    assert type(err) is UpstreamUnavailable
    assert err.details["url"] == f"{oip_server.url}/v2/models/m/infer"
    assert isinstance(err.__cause__, aiohttp.ClientPayloadError)


def test_a_url_the_client_cannot_use_is_an_upstream_error() -> None:
    err = raised(lambda c: c.infer("ftp://up", "m", {"x": IMAGE}))
    assert type(err) is UpstreamError and err.details["url"] == "ftp://up/v2/models/m/infer"


@pytest.mark.parametrize(
    "reply",
    [(503, {}, b""), (204, {}, b""),
     (400, JSON, b'{"error": "not ready", "code": "model_not_found"}')],
    ids=["503", "204", "400"],
)
def test_ready_is_false_unless_the_server_says_200(oip_server, reply: Any) -> None:
    oip_server.replies["/v2/health/ready"] = reply
    assert run(lambda c: c.ready(oip_server.url)) is False


def test_metadata_that_is_not_json_is_an_upstream_error(oip_server) -> None:
    oip_server.replies["/v2/models/m"] = (200, {}, b"<html>")
    err = raised(lambda c: c.model_metadata(oip_server.url, "m"))
    assert type(err) is UpstreamError and "not JSON" in err.message


def test_bad_header_length_from_upstream_is_an_upstream_error(oip_server) -> None:
    oip_server.replies["/v2/models/m/infer"] = (
        200, {"Inference-Header-Content-Length": "x"}, b'{"outputs": []}')
    err = raised(lambda c: c.infer(oip_server.url, "m", {"x": IMAGE}))
    assert type(err) is UpstreamError and "malformed" in err.message


def test_a_closed_client_refuses_to_send(oip_server) -> None:
    async def scenario(client: OipClient) -> None:
        await client.close()
        await client.infer(oip_server.url, "echo", {"x": IMAGE})

    err = raised(scenario)
    assert type(err) is UpstreamError and "closed" in err.message


def test_client_validates_its_configuration() -> None:
    with pytest.raises(ValueError, match="timeout_s > 0"):
        OipClient(timeout_s=0)


@pytest.fixture
def closed_port_url() -> Iterator[str]:
    """A loopback URL nothing listens on: the port stays bound (not listening) for the test,
    so the kernel refuses connections and no other socket can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
