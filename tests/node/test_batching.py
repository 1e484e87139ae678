"""Dynamic batching on a real node (``NodeService`` in its OIP app, in-process, a real ONNX
model): concurrent requests run in batches, and every answer is the one the request gets
unbatched — named directly or routed."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import numpy as np
import pytest
from mlp_support import mlp

from tierlink.core.types import Tier
from tierlink.models.onnx import OnnxModel
from tierlink.models.runtime import ModelInfo
from tierlink.node.app import create_app
from tierlink.node.batching import batchable
from tierlink.node.service import NodeService
from tierlink.node.spec import NodeSpec
from tierlink.settings.batching import BatchSettings
from tierlink.settings.routing import parse_routing
from tierlink.transport import oip

CLIENTS = 24


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> OnnxModel:
    path = mlp(tmp_path_factory.mktemp("batching") / "model.onnx")
    return OnnxModel(path, ModelInfo("mlp", "digits", "1", accuracy=0.9, latency_ms=1.0))


def inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.random((1 + i % 3, 1, 28, 28), dtype=np.float32) for i in range(n)]


async def send(client: httpx.AsyncClient, path: str, x: np.ndarray,
               params: dict[str, object] | None = None) -> oip.InferResponseData:
    body, headers = oip.encode_infer_request({"input": x}, params, None)
    resp = await client.post(path, content=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return oip.decode_infer_response(resp.content, oip.parse_header_length(
        resp.headers.get("inference-header-content-length")))


def batch_sizes(metrics: str) -> dict[str, float]:
    """``tierlink_batch_size`` of model ``mlp``: observations and their sum."""
    found = dict(re.findall(r'tierlink_batch_size_(count|sum)\{model="mlp",tier="cloud"\} (\S+)',
                            metrics))
    return {k: float(v) for k, v in found.items()}


def serve(runtime: OnnxModel, max_batch: int) -> NodeService:
    batching = {"mlp": BatchSettings(max_batch=max_batch)} if max_batch > 1 else {}
    spec = NodeSpec("cloud-1", Tier.CLOUD, (), workers=1, batching=batching,
                    routing=parse_routing({"thresholds": {}}))
    return NodeService(spec, {"mlp": runtime})


def test_the_model_is_batchable(runtime: OnnxModel) -> None:
    assert batchable(runtime)


@pytest.mark.parametrize("routed", [False, True])
def test_batched_answers_are_the_unbatched_ones(runtime: OnnxModel, routed: bool) -> None:
    xs = inputs(CLIENTS)
    path = "/v2/models/digits/infer" if routed else "/v2/models/mlp/infer"
    params = {"tierlink.deadline_ms": 10_000} if routed else None
    key = "probabilities" if routed else "logits"

    async def answers(max_batch: int) -> tuple[list[np.ndarray], str]:
        app = create_app(serve(runtime, max_batch), ready=True)
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
            outs = await asyncio.gather(*(send(client, path, x, params) for x in xs))
            metrics = (await client.get("/metrics")).text
        return [o.outputs[key] for o in outs], metrics

    alone, _ = asyncio.run(answers(1))
    together, metrics = asyncio.run(answers(8))
    for a, b in zip(alone, together, strict=True):
        assert np.array_equal(a, b)
    sizes = batch_sizes(metrics)
    assert sizes["sum"] == CLIENTS  # every request counted in one run
    assert sizes["count"] < CLIENTS  # and some ran together


def test_a_fleet_files_batching_reaches_the_node_spec() -> None:
    spec = NodeSpec("cloud-1", Tier.CLOUD, (), batching={"mlp": BatchSettings(8, 2.0)})
    again = NodeSpec.from_json(spec.to_json())
    assert again.batching == {"mlp": BatchSettings(8, 2.0)}
    assert json.loads(spec.to_json())["batching"] == {
        "mlp": {"max_batch": 8, "max_delay_ms": 2.0}}
