"""Escalations on a real node (``NodeService`` in its OIP app, in-process, a real ONNX
model): work whose caller holds an answer already (``tierlink.escalation``) is refused with
``429 escalation_shed`` once the queue is ``escalation_queue`` deep; work with no answer yet
is still queued."""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import pytest
from mlp_support import mlp

from tierlink.core.types import Tier
from tierlink.models.onnx import OnnxModel
from tierlink.models.runtime import ModelInfo
from tierlink.node.app import create_app
from tierlink.node.service import NodeService
from tierlink.node.spec import NodeSpec
from tierlink.settings.routing import parse_routing
from tierlink.transport import oip

CLIENTS = 16


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> OnnxModel:
    path = mlp(tmp_path_factory.mktemp("escalations") / "model.onnx", hidden=4096)
    return OnnxModel(path, ModelInfo("mlp", "digits", "1", accuracy=0.9, latency_ms=4.0))


async def post(client: httpx.AsyncClient, x: np.ndarray, escalation: bool) -> httpx.Response:
    params = {"tierlink.deadline_ms": 10_000, "tierlink.hops": 1, "tierlink.origin": "dev-1",
              "tierlink.escalation": escalation}
    body, headers = oip.encode_infer_request({"input": x}, params, None)
    return await client.post("/v2/models/digits/infer", content=body, headers=headers)


def test_a_node_sheds_escalations_past_its_escalation_queue(runtime: OnnxModel) -> None:
    spec = NodeSpec("edge-1", Tier.EDGE, (), workers=1, escalation_queue=2,
                    routing=parse_routing({"thresholds": {}}))
    xs = [np.random.default_rng(i).random((8, 1, 28, 28), dtype=np.float32)
          for i in range(CLIENTS)]

    async def main() -> tuple[list[httpx.Response], list[httpx.Response], str]:
        app = create_app(NodeService(spec, {"mlp": runtime}), ready=True)
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
            escalations = await asyncio.gather(*(post(client, x, True) for x in xs))
            plain = await asyncio.gather(*(post(client, x, False) for x in xs))
            metrics = (await client.get("/metrics")).text
        return escalations, plain, metrics

    escalations, plain, metrics = asyncio.run(main())
    codes = [r.status_code for r in escalations]
    shed = [r for r in escalations if r.status_code == 429]
    assert set(codes) == {200, 429} and len(shed) >= CLIENTS // 2, codes
    for r in shed:
        body = r.json()
        assert body["code"] == "escalation_shed", body
        assert "escalation_shed" in body["error"]
    assert [r.status_code for r in plain] == [200] * CLIENTS  # queued up to max_queue
    refused = re.search(r'tierlink_admission_refused_total\{reason="escalation_shed",'
                        r'tier="edge"\} (\S+)', metrics)
    assert refused is not None and float(refused.group(1)) == len(shed)
