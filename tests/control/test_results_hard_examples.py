"""Hard examples delivered through nodes' outboxes: ``POST /v1/results`` hands items of kind
``hard_example`` to the hard-example store (not ``async_results``), once per key and once per
example, rejects a malformed one alone; the per-kind handler contract of ResultStore; and a
node's uploader, outbox and uplink against the real control app, with a lost answer."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tierlink.control.app import create_app
from tierlink.control.results import ResultStore, install_result_routes
from tierlink.control.store import SqliteRegistryStore
from tierlink.core.types import Placement, Privacy, Request, Tier
from tierlink.errors import ConfigError, ControlPlaneError, InvalidRequest
from tierlink.fleet.config import HardExampleConfig
from tierlink.node.hard_examples import HardExampleUploader, OutboxSink, example_key
from tierlink.node.uplink import CONTROL, Uplink, UplinkConfig
from tierlink.outbox import AckStatus, Backoff, wire

# -- wire helpers -----------------------------------------------------------------------------


def example(rid: str = "r1", *, node: str = "dev-1", row: int = 0,
            **overrides: Any) -> dict[str, Any]:
    """A HardExampleIn payload, as HardExample.to_wire makes it."""
    x = np.full((1, 28, 28), 0.25, np.float32)
    body = {"request_id": rid, "row": row, "node_id": node, "model": "fmnist-small",
            "task": "fmnist", "privacy": "any", "prediction": 3, "confidence": 0.42,
            "threshold": 0.9, "label": 7, "created_at": 1000.0,
            "input": {"datatype": "FP32", "shape": [1, 28, 28],
                      "data": base64.b64encode(x.astype("<f4").tobytes()).decode()}}
    body.update(overrides)
    return body


def hard(payload: dict[str, Any], key: str | None = None, **extra: Any) -> dict[str, Any]:
    key = key or example_key(payload["node_id"], payload["request_id"], payload["model"],
                             payload["row"], payload["created_at"])
    return {"key": key, "kind": "hard_example", "payload": payload, "created_at": 1000.0,
            **extra}


def batch(*items: dict[str, Any], sender: str = "dev-1") -> dict[str, Any]:
    return {"from": sender, "items": list(items)}


def statuses(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [a["status"] for a in answer.json()["acks"]]


# -- through the control app ---------------------------------------------------------------


@pytest.fixture
def http(tmp_path: Path, store_kind: str, request: pytest.FixtureRequest
         ) -> Iterator[TestClient]:
    """The control app (open: no identity store) with hard examples and results in its
    SQLite file, or in etcd as replicas keep them."""
    registry = SqliteRegistryStore(tmp_path / "control.db")
    shared: dict[str, Any] = {}
    etcd = None
    if store_kind == "etcd":
        from tierlink.control.etcd_hard_examples import EtcdHardExampleStore
        from tierlink.control.etcd_results import EtcdResultStore
        from tierlink.etcd.client import Etcd

        prefix = request.getfixturevalue("etcd_prefix")
        etcd = Etcd(request.getfixturevalue("etcd_cluster").endpoints)
        from tierlink.repo.blobs import BlobStore

        shared = {"hard_examples": EtcdHardExampleStore(etcd, BlobStore(tmp_path / "blobs"),
                                                        prefix=prefix + "hard/"),
                  "results": EtcdResultStore(etcd, prefix=prefix + "results/")}
    app = create_app(registry, **shared)
    try:
        with TestClient(app) as client:
            yield client
    finally:
        registry.close()
        if etcd is not None:
            etcd.close()


def stored(http: TestClient) -> list[dict[str, Any]]:
    page = http.get("/v1/hard-examples", params={"limit": 1000})
    assert page.status_code == 200, page.text
    return list(page.json()["examples"])


def sample(http: TestClient, name: str, outcome: str) -> float | None:
    registry = http.app.state.registry.metrics.registry  # type: ignore[attr-defined]
    return registry.get_sample_value(name, {"outcome": outcome})  # type: ignore[no-any-return]


def test_a_hard_example_item_lands_in_the_hard_example_store_exactly_once(
        http: TestClient) -> None:
    sent = batch(hard(example("r1")))
    assert statuses(http.post("/v1/results", json=sent)) == ["ok"]
    assert statuses(http.post("/v1/results", json=sent)) == ["duplicate"]  # a replay
    rows = stored(http)
    assert [(r["node_id"], r["request_id"], r["label"], r["shape"]) for r in rows] == \
        [("dev-1", "r1", 7, [1, 28, 28])]
    # Not an async result: it is neither listed nor readable there.
    assert http.get("/v1/results").json()["results"] == []
    key = sent["items"][0]["key"]
    assert http.get(f"/v1/results/{key}").status_code == 404
    assert sample(http, "tierlink_control_hard_examples_total", "stored") == 1
    assert sample(http, "tierlink_control_results_total", "stored") == 1
    assert sample(http, "tierlink_control_results_total", "duplicate") == 1
    export = http.get("/v1/hard-examples/export")
    assert export.headers["X-Tierlink-Examples"] == "1"


def test_a_malformed_hard_example_is_rejected_alone(http: TestClient) -> None:
    bad = hard(example("bad", input={"datatype": "FP32", "shape": [1, 28, 28], "data": "AAAA"}))
    result = {"key": "dev-1:async-1", "kind": "result", "payload": {"request_id": "async-1"},
              "created_at": 1000.0}
    answer = http.post("/v1/results", json=batch(bad, hard(example("good")), result))
    assert statuses(answer) == ["rejected", "ok", "ok"]
    detail = answer.json()["acks"][0]["detail"]
    assert "invalid hard example" in detail and "input" in detail and "bytes" in detail
    assert [r["request_id"] for r in stored(http)] == ["good"]
    assert [r["key"] for r in http.get("/v1/results").json()["results"]] == ["dev-1:async-1"]
    # Nothing was recorded for the rejected key: a replay is judged (and rejected) again.
    assert statuses(http.post("/v1/results", json=batch(bad))) == ["rejected"]
    assert sample(http, "tierlink_control_hard_examples_total", "rejected") == 2
    assert sample(http, "tierlink_control_results_total", "rejected") == 2


@pytest.mark.parametrize(("field", "value"), [("privacy", "local"), ("confidence", 1.5),
                                              ("request_id", "")])
def test_a_payload_the_store_refuses_is_rejected_naming_the_field(
        http: TestClient, field: str, value: Any) -> None:
    answer = http.post("/v1/results", json=batch(hard(example(**{field: value}), key="k")))
    assert statuses(answer) == ["rejected"]
    assert field in answer.json()["acks"][0]["detail"]
    assert stored(http) == []


def test_a_node_delivers_only_its_own_hard_examples(http: TestClient) -> None:
    forged = hard(example("r1", node="dev-2"))
    answer = http.post("/v1/results", json=batch(forged, sender="dev-1"))
    assert statuses(answer) == ["rejected"]
    assert "comes from 'dev-1'" in answer.json()["acks"][0]["detail"]
    # Relayed by an edge, the origin is the first node of the chain.
    relayed = hard(example("r1", node="dev-2"), chain=["dev-2"])
    assert statuses(http.post("/v1/results", json=batch(relayed, sender="edge-1"))) == ["ok"]
    assert [r["node_id"] for r in stored(http)] == ["dev-2"]


def test_the_same_example_under_another_key_is_still_stored_once(http: TestClient) -> None:
    # The key and the store's own (node, request, model, row, created_at) agree: a key lost
    # in a crash between the store's commit and the key's record, or an example posted
    # directly before the node got its outbox, is answered duplicate.
    assert statuses(http.post("/v1/results", json=batch(hard(example(), key="a")))) == ["ok"]
    assert statuses(http.post("/v1/results",
                              json=batch(hard(example(), key="b")))) == ["duplicate"]
    direct = http.post("/v1/hard-examples", json={"examples": [example("r2")]})
    assert direct.json()["stored"] == 1
    assert statuses(http.post("/v1/results", json=batch(hard(example("r2"))))) == ["duplicate"]
    assert sorted(r["request_id"] for r in stored(http)) == ["r1", "r2"]


# -- the handler contract of the result store -------------------------------------------


@pytest.fixture
def results(make_results: Callable[..., ResultStore]) -> ResultStore:
    """A result store, on SQLite and on etcd (tests/control/conftest.py)."""
    return make_results()


def parsed(*items: dict[str, Any], sender: str = "dev-1") -> wire.Batch:
    return wire.parse_batch(json.dumps(batch(*items, sender=sender)).encode())


def item(key: str, kind: str = "note", payload: Any = "hi") -> dict[str, Any]:
    return {"key": key, "kind": kind, "payload": payload, "created_at": 1.0}


class Notes:
    """A fake handler: holds payloads, refuses ``"bad"``, fails while ``broken``."""

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.calls: list[tuple[str, str]] = []
        self.broken = False

    def __call__(self, entry: wire.WireItem, sender: str) -> bool:
        self.calls.append((entry.key, sender))
        if self.broken:
            raise ControlPlaneError("disk failing")
        if entry.payload == "bad":
            raise InvalidRequest("invalid note: bad")
        if entry.payload in self.held:
            return False
        self.held.append(entry.payload)
        return True


def test_handled_kinds_go_to_their_handler_once_per_key_acks_in_item_order(
        results: ResultStore) -> None:
    notes = Notes()
    handlers = {"note": notes}
    mixed = parsed(item("n1"), item("r1", "result"), item("n2", payload="bad"),
                   item("n3", payload="hi"), item("n1"))
    acks = results.add(mixed, handlers)
    assert [(a.key, a.status) for a in acks] == [
        ("n1", AckStatus.OK), ("r1", AckStatus.OK), ("n2", AckStatus.REJECTED),
        ("n3", AckStatus.DUPLICATE),  # a new key, but the handler held it already
        ("n1", AckStatus.DUPLICATE)]  # the key again: the handler is not asked
    assert acks[2].detail == "invalid note: bad"
    assert [k for k, _ in notes.calls] == ["n1", "n2", "n3"]
    assert [r.key for r in results.page()] == ["r1"]  # only the unhandled kind here
    replay = results.add(parsed(item("n1"), item("n2", payload="bad")), handlers)
    assert [a.status for a in replay] == [AckStatus.DUPLICATE, AckStatus.REJECTED]
    assert [k for k, _ in notes.calls] == ["n1", "n2", "n3", "n2"]


def test_without_a_handler_any_kind_is_stored_here(results: ResultStore) -> None:
    acks = results.add(parsed(item("n1")))
    assert [a.status for a in acks] == [AckStatus.OK]
    stored_note = results.get("n1")
    assert stored_note is not None and stored_note.kind == "note"


def test_a_failing_handler_fails_the_batch_and_nothing_is_recorded(
        results: ResultStore) -> None:
    notes = Notes()
    notes.broken = True
    with pytest.raises(ControlPlaneError):
        results.add(parsed(item("n1")), {"note": notes})
    notes.broken = False  # the sender's retry goes through
    assert [a.status for a in results.add(parsed(item("n1")), {"note": notes})] == \
        [AckStatus.OK]


def test_a_handler_for_something_that_is_not_a_kind_is_refused(results: ResultStore) -> None:
    with pytest.raises(ConfigError, match="not an item kind"):
        install_result_routes(FastAPI(), results, handlers={"Hard Example": Notes()})


# -- a node's uploader and uplink against the real control app ----------------------------


def forward_to(http: TestClient, lose_first_answer: bool) -> httpx.MockTransport:
    """The uplink's transport: each request goes to the in-process app; the first answer
    can be lost after the app applied the batch (the node must send it again)."""
    lost: list[bool] = []

    def handle(request: httpx.Request) -> httpx.Response:
        answer = http.post(request.url.path, content=request.content,
                           headers={"content-type": "application/json"})
        if lose_first_answer and not lost:
            lost.append(True)
            raise httpx.ReadError("connection reset", request=request)
        return httpx.Response(answer.status_code, content=answer.content)

    return httpx.MockTransport(handle)


def test_a_node_s_hard_examples_reach_the_store_once_even_when_an_answer_is_lost(
        http: TestClient, tmp_path: Path) -> None:
    local = Placement("local", "dev-1", Tier.DEVICE, "fmnist-small", 0.9)
    probabilities = np.full((2, 10), 0.05, np.float32)
    probabilities[:, 0] = 0.55  # both rows below 0.9
    x = np.random.default_rng(0).random((2, 1, 28, 28), np.float32)

    async def main() -> None:
        uplink = Uplink("dev-1", tmp_path / "state", control_url="http://control.test",
                        config=UplinkConfig(backoff=Backoff(base_s=0.01, max_s=0.05)),
                        rng=random.Random(0), transport=forward_to(http, True))
        up = HardExampleUploader(OutboxSink(uplink), HardExampleConfig(), "dev-1",
                                 eager=True)
        uplink.start()
        up.start()
        req = Request("r1", "fmnist", 150.0, "dev-1", privacy=Privacy.ANY)
        up.offer(local, req, {"input": x}, probabilities, (4, 9))
        deadline = time.monotonic() + 10.0
        while uplink.outbox.pending(CONTROL) or up.pending:
            assert time.monotonic() < deadline, "the outbox did not drain"
            await asyncio.sleep(0.01)
        await up.stop()
        await uplink.stop()

    asyncio.run(main())
    rows = stored(http)
    assert sorted((r["request_id"], r["row"], r["label"]) for r in rows) == \
        [("r1", 0, 4), ("r1", 1, 9)]
    assert sample(http, "tierlink_control_results_total", "duplicate") == 2  # the resend
    export = http.get("/v1/hard-examples/export")
    assert export.headers["X-Tierlink-Examples"] == "2"
