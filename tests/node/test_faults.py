"""Fault injection on a node: off unless the spec allows it; a slowdown slows local compute."""

import time

import numpy as np
from fastapi.testclient import TestClient

from tierlink.core.types import Tier
from tierlink.models.runtime import FakeModel, ModelInfo
from tierlink.node.app import create_app
from tierlink.node.service import NodeService
from tierlink.node.spec import NodeSpec
from tierlink.transport import oip


def _client(fault_injection: bool) -> TestClient:
    info = ModelInfo("fmnist-small", "fmnist", "1", accuracy=0.9, latency_ms=0.5)
    spec = NodeSpec("dev-1", Tier.DEVICE, (), fault_injection=fault_injection)
    return TestClient(create_app(NodeService(spec, {"fmnist-small": FakeModel(info, latency_ms=10.0)}),
                                 ready=True))


def _infer_ms(client: TestClient) -> float:
    body, headers = oip.encode_infer_request(
        {"input": np.full((1, 1, 28, 28), 0.5, dtype=np.float32)}, None, None)
    start = time.perf_counter()
    assert client.post("/v2/models/fmnist-small/infer", content=body,
                       headers=headers).status_code == 200
    return (time.perf_counter() - start) * 1000


def test_faults_are_refused_unless_enabled():
    with _client(False) as c:
        r = c.post("/tierlink/v1/faults", json={"slowdown": 10})
        assert r.status_code == 400 and "fault injection is off" in r.json()["error"]


def test_a_slowdown_multiplies_local_compute():
    with _client(True) as c:
        base = min(_infer_ms(c) for _ in range(3))
        assert c.post("/tierlink/v1/faults", json={"slowdown": 5}).json() == {"slowdown": 5.0}
        slow = min(_infer_ms(c) for _ in range(3))
        assert slow > base + 30  # 10 ms of compute became ~50 ms
        assert c.post("/tierlink/v1/faults", json={"slowdown": 0.5}).status_code == 400
        assert c.post("/tierlink/v1/faults", content=b"nope").status_code == 400
