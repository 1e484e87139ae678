"""The application clients against a real node process and its control plane on loopback
(``node_fleet``: ``edge-1`` serving ``fmnist-medium``, the task ``fmnist``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from tierlink import AsyncClient, Client
from tierlink.core.types import Tier
from tierlink.errors import ModelNotFound, NotEnrolled, TensorError
from tierlink.fleet.launcher import RunningFleet

from .conftest import MODEL, NODE, TASK

pytestmark = pytest.mark.integration


@pytest.fixture
def client(node_fleet: RunningFleet) -> Iterator[Client]:
    with Client(node_fleet.node_urls[NODE], control_url=node_fleet.control_url,
                admin_token=node_fleet.admin_token, timeout_s=10.0) as c:
        yield c


def test_a_task_is_routed_and_says_how(client: Client, images: np.ndarray) -> None:
    answer = client.infer(TASK, images, deadline_ms=2000, privacy="site", priority="realtime")
    probs = answer["probabilities"]  # (2, 10)
    assert probs.shape == (2, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(answer["label"], probs.argmax(axis=1))
    assert answer.routed and (answer.served_by, answer.tier, answer.model) == (
        NODE, Tier.EDGE, MODEL)
    assert answer.path == (NODE,) and answer.escalations == 0 and answer.fallbacks == ()
    # A batch is as sure as its least sure row.
    assert answer.confidence == pytest.approx(float(probs.max(axis=1).min()), abs=1e-5)
    assert answer.cost_usd is not None and answer.cost_usd > 0
    assert answer.degraded == "" and answer.model_version == "1"
    assert answer.server_ms is not None and answer.server_ms > 0
    assert answer.uplink == "up"


def test_a_model_runs_here_and_agrees_with_the_task(client: Client,
                                                    images: np.ndarray) -> None:
    raw = client.infer(MODEL, images, version="1")
    logits = raw["logits"]  # (2, 10)
    assert logits.shape == (2, 10) and not raw.routed
    assert raw.model_version == "1" and raw.server_ms is not None
    routed = client.infer(TASK, {"input": images}, privacy="site")
    # Same model: temperature scaling keeps the argmax.
    np.testing.assert_array_equal(routed["label"], logits.argmax(axis=1))


def test_the_async_client_against_the_node(node_fleet: RunningFleet,
                                           images: np.ndarray) -> None:
    async def scenario() -> None:
        async with AsyncClient(node_fleet.node_urls[NODE], timeout_s=10.0) as node:
            assert await node.ready()
            answers = await asyncio.gather(*(node.infer(TASK, images[i : i + 1],
                                                        deadline_ms=2000)
                                             for i in range(len(images))))
            assert [a.served_by for a in answers] == [NODE] * len(images)
            names = {m.name: m.reason for m in await node.models()}
            assert names == {MODEL: "", TASK: "routed task"}
        assert asyncio.all_tasks() == {asyncio.current_task()}, "tasks leaked"

    asyncio.run(scenario())


def test_an_unknown_model_raises_the_nodes_404_with_its_hint(client: Client,
                                                             images: np.ndarray) -> None:
    with pytest.raises(ModelNotFound) as info:
        client.infer("no-such-model", {"input": images})
    err = info.value
    assert err.code == "model_not_found" and err.http_status == 404
    assert err.details["status"] == 404
    assert MODEL in err.hint and TASK in err.hint  # the node lists what it serves
    with pytest.raises(ModelNotFound):
        client.infer(MODEL, images, version="99")


@pytest.mark.parametrize("bad", ["float64", "shape"])
def test_a_malformed_input_is_refused_with_a_400(client: Client, images: np.ndarray,
                                                 bad: str) -> None:
    x = images.astype(np.float64) if bad == "float64" else images[:, 0]  # (2, 28, 28)
    with pytest.raises(TensorError) as info:
        client.infer(MODEL, x)
    assert info.value.http_status == 400 and info.value.details["status"] == 400
    assert "input" in info.value.message


def test_an_asynchronous_request_and_its_result(client: Client, images: np.ndarray) -> None:
    accepted = client.infer(TASK, images, asynchronous=True, request_id="client-async-1")
    assert accepted.result_key == f"{NODE}:client-async-1" and accepted.uplink == "up"
    result = client.result(accepted, wait_s=10.0)
    assert result is not None, "the result did not reach the control plane in 10 s"
    assert (result.request_id, result.task, result.node, result.served_by) == (
        "client-async-1", TASK, NODE, NODE)
    assert result.tier is Tier.EDGE and result.model == MODEL and len(result.predictions) == 2
    direct = client.infer(TASK, images)
    assert list(result.predictions) == direct["label"].tolist()
    assert client.result(f"{NODE}:never-sent") is None


def test_reading_results_without_the_operators_token_is_refused(
        node_fleet: RunningFleet) -> None:
    client = Client(node_fleet.node_urls[NODE], control_url=node_fleet.control_url)
    with client, pytest.raises(NotEnrolled):
        client.result(f"{NODE}:anything")
