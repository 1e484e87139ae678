"""The stock ``tritonclient.grpc`` client against a real edge node's gRPC API: health,
metadata, inference of a model (equal to ONNX Runtime's on the same file) and of a task
(routed, with the routing's parameters), and errors as gRPC status codes — the node keeps
serving after each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import Models
from .test_tritonclient import MODEL, NODE, onnxruntime_logits

pytestmark = pytest.mark.integration
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def triton(shared_fleet: RunningFleet) -> Iterator[Any]:
    client = grpcclient.InferenceServerClient(url=shared_fleet.node_grpc[NODE])
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def batch(fmnist_test: Labelled) -> np.ndarray:
    return np.ascontiguousarray(fmnist_test.input[:4])  # (4, 1, 28, 28) float32


def infer(client: Any, model: str, x: np.ndarray, outputs: list[str] | None = None,
          parameters: dict[str, Any] | None = None, name: str = "input") -> Any:
    inp = grpcclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    wanted = [grpcclient.InferRequestedOutput(o) for o in outputs or []]
    return client.infer(model, [inp], outputs=wanted or None, parameters=parameters,
                        client_timeout=30.0)


def status_of(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as err:
        call()
    return str(err.value.status()), err.value.message()


def test_health_and_metadata(triton: Any) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready(MODEL)
    meta = triton.get_model_metadata(MODEL, as_json=True)
    assert meta["name"] == MODEL and meta["platform"] == "onnxruntime_onnx"
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("input", "FP32", ["-1", "1", "28", "28"])]
    assert triton.get_server_metadata(as_json=True)["name"] == "tierlink"
    status, message = status_of(lambda: triton.get_model_metadata("no-such-model"))
    assert status == "StatusCode.NOT_FOUND" and "no-such-model" in message


def test_a_model_answers_as_onnxruntime(triton: Any, zoo_models: Models,
                                        batch: np.ndarray) -> None:
    got = infer(triton, MODEL, batch, ["logits"]).as_numpy("logits")
    np.testing.assert_allclose(got, onnxruntime_logits(zoo_models, batch), rtol=1e-5,
                               atol=1e-6)


def test_a_task_is_routed_with_its_parameters(triton: Any, batch: np.ndarray) -> None:
    result = infer(triton, "fmnist", batch[:1],
                   parameters={"tierlink.deadline_ms": 5000, "tierlink.privacy": "any"})
    assert result.as_numpy("probabilities").shape == (1, 10)
    assert result.as_numpy("label").shape == (1,)
    params = result.get_response().parameters
    assert params["tierlink.served_by"].string_param in ("edge-1", "cloud-1")
    assert params["tierlink.server_ms"].double_param > 0


@pytest.mark.parametrize(("call", "code", "says"), [
    (lambda c, x: infer(c, "no-such-model", x), "NOT_FOUND", "no-such-model"),
    (lambda c, x: infer(c, MODEL, x[:, :, :14]), "INVALID_ARGUMENT", "shape"),
    (lambda c, x: infer(c, MODEL, x, name="image"), "INVALID_ARGUMENT", "takes inputs"),
    (lambda c, x: infer(c, "fmnist", x, parameters={"tierlink.privacy": "secret"}),
     "INVALID_ARGUMENT", "tierlink.privacy"),
    (lambda c, x: infer(c, "fmnist", x, parameters={"tierlink.deadline_ms": -5}),
     "INVALID_ARGUMENT", "tierlink.deadline_ms"),
    (lambda c, x: infer(c, MODEL, x, ["nope"]), "INVALID_ARGUMENT", "unknown output"),
])
def test_a_callers_mistake_is_its_status_and_the_node_keeps_serving(
        triton: Any, batch: np.ndarray, call: Any, code: str, says: str) -> None:
    status, message = status_of(lambda: call(triton, batch))
    assert status == f"StatusCode.{code}" and says in message
    assert infer(triton, MODEL, batch[:1], ["logits"]).as_numpy("logits").shape == (1, 10)


def test_requests_are_counted_in_the_nodes_metrics(shared_fleet: RunningFleet, triton: Any,
                                                   batch: np.ndarray) -> None:
    import httpx

    def answered() -> float:
        text = httpx.get(f"{shared_fleet.node_urls[NODE]}/metrics", timeout=5).text
        line = next((l for l in text.splitlines() if l.startswith("tierlink_requests_total{")
                     and f'model="{MODEL}"' in l and 'outcome="ok"' in l), None)
        return float(line.rsplit(" ", 1)[1]) if line else 0.0

    before = answered()
    infer(triton, MODEL, batch[:1])
    assert answered() == before + 1


def test_tierlinks_own_grpc_client_gets_answers_and_errors_back(
        shared_fleet: RunningFleet, zoo_models: Models, batch: np.ndarray) -> None:
    import asyncio

    from tierlink.errors import InvalidRequest, ModelNotFound
    from tierlink.transport.grpc_client import GrpcClient

    async def main() -> None:
        async with GrpcClient(shared_fleet.node_grpc[NODE]) as client:
            assert await client.live()
            answer = await client.infer(MODEL, {"input": batch})
            np.testing.assert_allclose(answer.outputs["logits"],
                                       onnxruntime_logits(zoo_models, batch),
                                       rtol=1e-5, atol=1e-6)
            with pytest.raises(ModelNotFound):
                await client.infer("no-such-model", {"input": batch})
            with pytest.raises(InvalidRequest, match="tierlink.privacy"):
                await client.infer("fmnist", {"input": batch},
                                   {"tierlink.privacy": "secret"})

    asyncio.run(main())
