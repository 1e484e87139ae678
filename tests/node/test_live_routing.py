"""A node changes its routing while it serves: a heartbeat answer's revision swaps its whole
router at once; a request in flight finishes, is fed back and is labelled under the revision
that placed it; a revision the node cannot make is refused and the old one kept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from tierlink.core.types import Tier
from tierlink.models.runtime import FakeModel, ModelInfo
from tierlink.node.app import create_app
from tierlink.node.service import NodeService
from tierlink.node.spec import NodeSpec
from tierlink.policy import BanditPolicy, TierlinkPolicy
from tierlink.settings.routing import parse_routing
from tierlink.transport import oip

PARAMS = {"tierlink.privacy": "local", "tierlink.deadline_ms": 5000}


def service(latency_ms: float = 0.0, state_dir: Path | None = None) -> NodeService:
    info = ModelInfo("fmnist-small", "fmnist", "1", accuracy=0.9, latency_ms=0.5)
    spec = NodeSpec("dev-1", Tier.DEVICE, (), routing=parse_routing({"policy": "tierlink"}),
                    routing_revision=1, state_dir=str(state_dir) if state_dir else None)
    return NodeService(spec, {"fmnist-small": FakeModel(info, latency_ms=latency_ms)})


def revision(number: int, **routing: object) -> dict[str, object]:
    return {"routing": {"revision": number, "config": parse_routing(routing).to_dict()}}


def x() -> np.ndarray:
    return np.full((1, 1, 28, 28), 0.5, dtype=np.float32)


def test_a_new_revision_swaps_the_policy_and_labels_every_answer() -> None:
    node = service()
    with TestClient(create_app(node, ready=True)) as client:
        def routed() -> dict[str, object]:
            body, headers = oip.encode_infer_request({"input": x()}, PARAMS, None)
            resp = client.post("/v2/models/fmnist/infer", content=body, headers=headers)
            assert resp.status_code == 200, resp.text
            return oip.decode_infer_response(resp.content, oip.parse_header_length(
                resp.headers.get("inference-header-content-length"))).parameters

        assert routed()["tierlink.routing_revision"] == 1
        assert isinstance(node.live.router.desk.default, TierlinkPolicy)
        asyncio.run(node.apply_answer(revision(2, policy={"name": "bandit",
                                                          "options": {"prior_weight": 4}})))
        assert isinstance(node.live.router.desk.default, BanditPolicy)
        assert routed()["tierlink.routing_revision"] == 2
        status = client.get("/tierlink/v1/status").json()
        assert status["routing_revision"] == 2 and status["policy"] == "bandit"
        assert node.heartbeat_body("http://127.0.0.1:1")["routing_revision"] == 2
        assert "tierlink_routing_revision{tier=\"device\"} 2.0" in client.get("/metrics").text


def test_a_request_in_flight_finishes_under_the_revision_that_placed_it() -> None:
    node = service(latency_ms=200.0)

    async def main() -> tuple[int, int]:
        await node.start()
        try:
            first = asyncio.create_task(node.infer_task("fmnist", {"input": x()}, PARAMS, "a"))
            await asyncio.sleep(0.05)  # planned, computing
            await node.apply_answer(revision(2, weights={"cost": 0.0}))
            second = await node.infer_task("fmnist", {"input": x()}, PARAMS, "b")
            return (await first)[1].routing_revision, second[1].routing_revision
        finally:
            await node.stop()

    assert asyncio.run(main()) == (1, 2)


def test_a_revision_the_node_cannot_make_is_refused_and_the_old_one_kept() -> None:
    node = service()
    before = node.live.router
    # a policy no installed package registers (the control plane would refuse it too)
    config = parse_routing({}).to_dict() | {"policy": "not-installed-here"}
    asyncio.run(node.apply_answer({"routing": {"revision": 3, "config": config}}))
    asyncio.run(node.apply_answer({"routing": {"revision": "x", "config": {}}}))
    assert node.live.router is before and node.live.revision == 1
    assert node.metrics.routing_refused.labels("device")._value.get() == 1


def test_shadow_mode_can_be_switched_on_live_and_logs_to_the_nodes_file(
        tmp_path: Path) -> None:
    node = service(state_dir=tmp_path)
    assert node.live.router.shadow is None
    asyncio.run(node.apply_answer(revision(2, shadow={"policy": "device_only"})))
    assert node.live.router.shadow is not None
    with TestClient(create_app(node, ready=True)) as client:
        body, headers = oip.encode_infer_request({"input": x()}, PARAMS, None)
        assert client.post("/v2/models/fmnist/infer", content=body,
                           headers=headers).status_code == 200
    assert '"candidate_policy":{"policy":"device_only"' in (tmp_path / "shadow.jsonl").read_text()
