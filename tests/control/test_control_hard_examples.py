"""The control plane's hard-example store: SQLite table (cap, dedupe, upgrade from schema 1),
the HTTP API (validation, listing, .npz export, disk errors) and the async client."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tierlink.control.app import create_app
from tierlink.control.client import ControlClient
from tierlink.control.etcd_hard_examples import EtcdHardExampleStore
from tierlink.control.schemas import HardExampleIn
from tierlink.control.store import HardExampleStore, SqliteHardExampleStore, SqliteRegistryStore
from tierlink.errors import ControlPlaneError
from tierlink.etcd.client import Etcd
from tierlink.repo.blobs import BlobStore


def example(rid: str = "r1", *, model: str = "fmnist-small", node: str = "dev-1",
            label: int = -1, fill: float = 0.25, shape: tuple[int, ...] = (1, 28, 28),
            **overrides: Any) -> dict[str, Any]:
    x = np.full(shape, fill, np.float32)
    body = {"request_id": rid, "row": 0, "node_id": node, "model": model, "task": "fmnist",
            "privacy": "any", "prediction": 3, "confidence": 0.42, "threshold": 0.9,
            "label": label, "created_at": 1000.0,
            "input": {"datatype": "FP32", "shape": list(shape),
                      "data": base64.b64encode(x.astype("<f4").tobytes()).decode()}}
    body.update(overrides)
    return body


def parsed(*bodies: dict[str, Any]) -> list[HardExampleIn]:
    return [HardExampleIn.model_validate(b) for b in bodies]


# -- the store ------------------------------------------------------------------------------


@pytest.fixture
def store(store_kind: str, request: pytest.FixtureRequest, tmp_path: Path
          ) -> Iterator[HardExampleStore]:
    """A store capped at 3 rows: in SQLite, and in etcd as control-plane replicas share it."""
    if store_kind == "sqlite":
        s = SqliteHardExampleStore(":memory:", max_rows=3)
        yield s
        s.close()
        return
    with Etcd(request.getfixturevalue("etcd_cluster").endpoints) as etcd:
        yield EtcdHardExampleStore(etcd, BlobStore(tmp_path / "blobs"),
                                   prefix=request.getfixturevalue("etcd_prefix"), max_rows=3)


def test_store_keeps_the_newest_rows_under_its_cap(store: HardExampleStore) -> None:
    first = store.add(parsed(example("a"), example("b")), now=1.0)
    second = store.add(parsed(example("c"), example("d")), now=2.0)
    assert (first.stored, first.evicted) == (2, 0)
    assert (second.stored, second.evicted) == (2, 1)
    assert [r.request_id for r in store.page()] == ["b", "c", "d"] and store.count() == 3


def test_a_retried_batch_is_stored_once(store: HardExampleStore) -> None:
    store.add(parsed(example("a")), now=1.0)
    again = store.add(parsed(example("a"), example("a", created_at=1001.0)), now=2.0)
    assert (again.stored, again.duplicates) == (1, 1)


def test_pages_filter_by_model_and_node_and_follow_ids(store: HardExampleStore) -> None:
    store.max_rows = 100  # type: ignore[attr-defined]
    store.add(parsed(example("a"), example("b", model="fmnist-medium", node="edge-1"),
                     example("c")), now=1.0)
    small = store.page(model="fmnist-small")
    assert [r.request_id for r in small] == ["a", "c"]
    assert [r.request_id for r in store.page(node="edge-1")] == ["b"]
    assert [r.request_id for r in store.page(after_id=small[0].id, limit=1)] == ["b"]
    record = small[0]
    assert (record.received_at, record.shape, record.datatype) == (1.0, [1, 28, 28], "FP32")


def test_export_reads_the_tensors_back(store: HardExampleStore) -> None:
    store.add(parsed(example("a", fill=0.5), example("b", shape=(1, 4, 4))), now=1.0)
    got = store.export()
    assert [e.record.request_id for e in got] == ["a", "b"]
    x = np.frombuffer(got[0].data, "<f4").reshape(got[0].record.shape)
    assert x.shape == (1, 28, 28) and float(x[0, 0, 0]) == 0.5
    assert [e.record.request_id for e in store.export(limit=1)] == ["a"]


@pytest.fixture
def on_etcd(etcd_cluster: Any, etcd_prefix: str, tmp_path: Path
            ) -> Iterator[EtcdHardExampleStore]:
    with Etcd(etcd_cluster.endpoints) as etcd:
        yield EtcdHardExampleStore(etcd, BlobStore(tmp_path / "blobs"), prefix=etcd_prefix,
                                   max_rows=2)


def _blobs(store: EtcdHardExampleStore) -> list[Path]:
    return sorted(p for p in (store.blobs.root / "sha256").rglob("*") if p.is_file())


def test_on_etcd_the_tensors_are_blobs_and_go_with_their_examples(
        on_etcd: EtcdHardExampleStore) -> None:
    """etcd holds the records (small), the shared blob folder the tensors: one blob per
    example (the same input twice is two), removed when its example is trimmed."""
    on_etcd.add(parsed(example("a"), example("b")), now=1.0)
    entries = on_etcd.log.after(0, 10)
    assert all(len(e.value) < 600 for e in entries)  # the record alone, not 3 KB of tensor
    blob = {json.loads(e.value)["request_id"]: on_etcd.blobs.path(json.loads(e.value)["blob"])
            for e in entries}
    assert _blobs(on_etcd) == sorted(blob.values())
    on_etcd.add(parsed(example("c")), now=2.0)  # "a" goes, and its blob with it
    assert [r.request_id for r in on_etcd.page()] == ["b", "c"]
    now = _blobs(on_etcd)
    assert len(now) == 2 and blob["a"] not in now and blob["b"] in now
    assert [e.record.request_id for e in on_etcd.export()] == ["b", "c"]


def test_on_etcd_an_example_too_large_for_an_etcd_entry_is_kept(
        on_etcd: EtcdHardExampleStore) -> None:
    big = np.full((1, 600, 600), 0.75, np.float32)  # 1.4 MB: more than an etcd entry takes
    on_etcd.add(parsed(example("big", shape=(1, 600, 600), fill=0.75)), now=1.0)
    (got,) = on_etcd.export()
    assert np.array_equal(np.frombuffer(got.data, "<f4").reshape(1, 600, 600), big)


def test_on_etcd_an_example_whose_blob_is_gone_is_left_out_of_an_export(
        on_etcd: EtcdHardExampleStore, caplog: pytest.LogCaptureFixture) -> None:
    on_etcd.add(parsed(example("a"), example("b")), now=1.0)
    _blobs(on_etcd)[0].unlink()  # a blob folder the replicas do not share, say
    exported = [e.record.request_id for e in on_etcd.export()]
    assert len(exported) == 1 and "not readable" in caplog.text
    assert [r.request_id for r in on_etcd.page()] == ["a", "b"]  # the records stay listed


def test_on_etcd_an_example_written_inline_by_an_earlier_version_is_read(
        on_etcd: EtcdHardExampleStore) -> None:
    x = np.full((1, 2, 2), 0.5, np.float32)
    meta = dict(example("old", shape=(1, 2, 2)))
    meta.pop("input")
    meta.update(received_at=1.0, datatype="FP32", shape=[1, 2, 2])
    on_etcd.log.append([("old-key", json.dumps(meta).encode() + b"\n" + x.tobytes())])
    (got,) = on_etcd.export()
    assert got.record.request_id == "old" and got.data == x.tobytes()


def test_a_schema_1_database_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE nodes (node_id TEXT PRIMARY KEY, tier TEXT NOT NULL,"
                 " heartbeat TEXT NOT NULL, started_at REAL NOT NULL, registered_at REAL NOT NULL,"
                 " last_seen REAL NOT NULL, generation INTEGER NOT NULL, state TEXT NOT NULL)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    registry = SqliteRegistryStore(path)
    examples = SqliteHardExampleStore(path)
    try:
        assert examples.add(parsed(example()), now=1.0).stored == 1
        assert registry.alive(now=1.0, ttl_s=5.0) == []
    finally:
        examples.close()
        registry.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3


# -- the HTTP API ---------------------------------------------------------------------------


@pytest.fixture
def http(clock: Any) -> Iterator[TestClient]:
    registry = SqliteRegistryStore(":memory:")
    app = create_app(registry, clock=clock, hard_example_max_rows=1000)
    yield TestClient(app)
    app.state.hard_examples.store.close()
    registry.close()


def post(http: TestClient, *bodies: dict[str, Any]) -> httpx.Response:
    return http.post("/v1/hard-examples", json={"examples": list(bodies)})


def counters(http: TestClient) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("outcome", "")): s.value
            for family in text_string_to_metric_families(http.get("/metrics").text)
            for s in family.samples if "hard_examples" in s.name}


def test_posted_examples_are_listed_without_their_tensors(http: TestClient, clock: Any) -> None:
    response = post(http, example("a", label=4), example("b"))
    assert response.status_code == 200, response.text
    assert response.json() == {"stored": 2, "duplicates": 0, "evicted": 0}
    page = http.get("/v1/hard-examples", params={"limit": 1}).json()
    assert [e["request_id"] for e in page["examples"]] == ["a"]
    assert page["examples"][0]["label"] == 4 and "data" not in page["examples"][0]
    assert page["examples"][0]["received_at"] == clock.now
    rest = http.get("/v1/hard-examples", params={"after_id": page["next_after_id"]}).json()
    assert [e["request_id"] for e in rest["examples"]] == ["b"] and rest["next_after_id"] is None
    assert counters(http)[("tierlink_control_hard_examples_total", "stored")] == 2
    assert counters(http)[("tierlink_control_hard_examples_stored", "")] == 2


@pytest.mark.parametrize("change, message", [
    ({"input": {"datatype": "FP32", "shape": [1, 28, 28], "data": "AAAA"}},
     "examples[0].input: data is 3 bytes, but FP32 [1, 28, 28] needs 3136"),
    ({"input": {"datatype": "FP32", "shape": [1, 28, 28], "data": "not base64!"}},
     "examples[0].input: data is not valid base64"),
    ({"privacy": "local"}, "examples[0].privacy"),
    ({"label": -2}, "examples[0].label"),
])
def test_a_malformed_batch_is_a_400_naming_the_field(http: TestClient, change: dict[str, Any],
                                                     message: str) -> None:
    response = post(http, example(**change))
    assert response.status_code == 400
    assert message in response.json()["error"] and response.json()["hint"]
    assert http.get("/v1/hard-examples").json()["examples"] == []
    assert counters(http)[("tierlink_control_hard_examples_total", "rejected")] == 1


def test_a_body_that_is_not_json_is_a_400(http: TestClient) -> None:
    response = http.post("/v1/hard-examples", content=b"{nope",
                         headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not JSON" in response.json()["error"]


def test_bad_query_parameters_are_a_400(http: TestClient) -> None:
    assert http.get("/v1/hard-examples", params={"limit": 0}).status_code == 400
    response = http.get("/v1/hard-examples", params={"after_id": "x"})
    assert response.status_code == 400 and "after_id" in response.json()["error"]
    # numbers beyond what an id can be, or below: a 400 naming the field, never a 500
    for params in ({"after_id": 2**64}, {"after_id": -1}):
        response = http.get("/v1/hard-examples", params=params)
        assert response.status_code == 400 and "after_id" in response.json()["error"]
    response = http.get("/v1/hard-examples/export", params={"limit": -5})
    assert response.status_code == 400 and "limit" in response.json()["error"]


def test_a_bad_query_anywhere_is_a_400_that_says_so(http: TestClient) -> None:
    response = http.get("/v1/nodes", params={"since": "1", "wait": 10**6})
    assert response.status_code == 400
    assert "wait" in response.json()["error"] and "heartbeat" not in response.json()["error"]


def test_export_is_an_npz_ready_for_retraining(http: TestClient) -> None:
    post(http, example("a", label=2, fill=0.1), example("b", fill=0.7),
         example("c", model="fmnist-medium", node="edge-1", privacy="site"))
    response = http.get("/v1/hard-examples/export", params={"model": "fmnist-small"})
    assert response.status_code == 200
    with np.load(io.BytesIO(response.content), allow_pickle=False) as npz:
        assert npz["inputs"].shape == (2, 1, 28, 28) and npz["inputs"].dtype == np.float32
        np.testing.assert_allclose(npz["inputs"][:, 0, 0, 0], [0.1, 0.7])
        assert npz["labels"].tolist() == [2, -1]
        assert npz["predictions"].tolist() == [3, 3]
        np.testing.assert_allclose(npz["confidences"], [0.42, 0.42])
        assert npz["models"].tolist() == ["fmnist-small"] * 2
        assert npz["nodes"].tolist() == ["dev-1"] * 2 and npz["privacy"].tolist() == ["any"] * 2
        assert npz["ids"].tolist() == sorted(npz["ids"].tolist())
    everything = http.get("/v1/hard-examples/export")
    with np.load(io.BytesIO(everything.content)) as npz:
        assert npz["models"].tolist()[-1] == "fmnist-medium" and len(npz["ids"]) == 3


def test_export_of_mixed_shapes_asks_for_a_model_filter(http: TestClient) -> None:
    post(http, example("a"), example("b", model="other", shape=(3, 4)))
    response = http.get("/v1/hard-examples/export")
    assert response.status_code == 400 and "?model=" in response.json()["hint"]


def test_an_empty_export_is_a_valid_npz(http: TestClient) -> None:
    with np.load(io.BytesIO(http.get("/v1/hard-examples/export").content)) as npz:
        assert npz["ids"].shape == (0,) and npz["labels"].shape == (0,)


def test_a_full_disk_is_a_clear_503_and_the_registry_keeps_serving(
        http: TestClient, make_body: Any) -> None:
    store = http.app.state.hard_examples.store  # type: ignore[attr-defined]
    page_count = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {page_count}")  # no room for new pages
    response = post(http, *[example(str(i)) for i in range(20)])
    assert response.status_code == 503
    body = response.json()
    assert "hard-example store" in body["error"] and "full" in body["error"]
    assert "free space" in body["hint"]
    beat = http.post("/v1/nodes/edge-1/heartbeat", json=make_body())
    assert beat.status_code == 200 and http.get("/healthz").status_code == 200


# -- the client -----------------------------------------------------------------------------


def test_client_posts_lists_and_exports(clock: Any) -> None:
    registry = SqliteRegistryStore(":memory:")
    app = create_app(registry, clock=clock)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], bytes]:
        async with ControlClient("http://control", transport=httpx.ASGITransport(app)) as c:
            ack = await c.post_hard_examples([example("a", label=1)])
            page = await c.hard_examples(model="fmnist-small")
            data = await c.export_hard_examples(model="fmnist-small")
            with pytest.raises(ControlPlaneError) as info:
                await c.post_hard_examples([example("b", privacy="local")])
            assert info.value.details["status"] == 400
            return ack, page, data

    try:
        ack, page, data = asyncio.run(scenario())
    finally:
        app.state.hard_examples.store.close()
        registry.close()
    assert ack["stored"] == 1 and page["examples"][0]["label"] == 1
    with np.load(io.BytesIO(data)) as npz:
        assert npz["labels"].tolist() == [1]


def test_an_authenticated_node_posts_only_its_own_hard_examples(tmp_path: Path) -> None:
    from tierlink.control.identity import IdentityStore, bearer

    db = tmp_path / "control.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, "admin-token-0123456789")
    secret = identity.enroll(identity.create_token(0.0), "dev-1", "device", 1.0)
    dev1 = {"authorization": bearer("node", secret, "dev-1")}
    admin = {"authorization": bearer("admin", "admin-token-0123456789")}
    try:
        with TestClient(create_app(registry, identity=identity)) as http:
            forged = http.post("/v1/hard-examples", headers=dev1,
                               json={"examples": [example("a"), example("b", node="dev-2")]})
            assert forged.status_code == 403 and "dev-2" in forged.json()["error"]
            assert forged.json()["code"] == "admin_required"
            assert http.get("/v1/hard-examples", headers=admin).json()["examples"] == []
            own = http.post("/v1/hard-examples", headers=dev1, json={"examples": [example("a")]})
            assert own.json()["stored"] == 1
            # An operator may post any node's (an import from elsewhere).
            relayed = http.post("/v1/hard-examples", headers=admin,
                                json={"examples": [example("c", node="dev-2")]})
            assert relayed.json()["stored"] == 1
            assert counters(http)[("tierlink_control_hard_examples_total", "rejected")] == 2
    finally:
        identity.close()
        registry.close()
