"""The fleet view: nodes by tier with their health (a silent node stays, as down), rates
over the window from the counts nodes report, confidence drift per model version, the
operator token, the live stream and the page."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tierlink.control.app import create_app
from tierlink.control.identity import IdentityStore
from tierlink.control.store import SqliteRegistryStore

TTL = 5.0


@pytest.fixture
def http(store: SqliteRegistryStore, clock: Any) -> TestClient:
    return TestClient(create_app(store, clock=clock, ttl_s=TTL))


def beat(http: TestClient, body: dict[str, Any]) -> None:
    response = http.post(f"/v1/nodes/{body['node_id']}/heartbeat", json=body)
    assert response.status_code == 200, response.text


def with_stats(body: dict[str, Any], requests: int, escalations: int,
               confidence: list[int]) -> dict[str, Any]:
    body["models"][0]["stats"] = {"requests": requests, "escalations": escalations,
                                  "confidence_buckets": confidence}
    return body


def device(make_body: Any, *, met: int, missed: int, served: dict[str, int], escalated: int,
           started_at: float = 1_733_139_000.0) -> dict[str, Any]:
    return make_body(node_id="dev-1", tier="device", upstream=[], links=[],
                     labels={"site": "lab"}, started_at=started_at,
                     traffic={"met": met, "missed": missed, "served": served,
                              "escalated": escalated},
                     breakers_open=["edge-9"], outbox_pending=3)


def test_nodes_by_tier_and_rates_over_the_window(http: TestClient, make_body: Any,
                                                 clock: Any) -> None:
    beat(http, with_stats(make_body(), 10, 1, [0] * 8 + [2, 8]))
    beat(http, device(make_body, met=10, missed=0, served={"device": 10}, escalated=0))
    first = http.get("/v1/fleet").json()
    assert first["traffic"]["requests"] == 0  # one sample: no window yet
    clock.advance(10)
    beat(http, with_stats(make_body(), 30, 9, [0] * 6 + [10, 0, 2, 18]))
    beat(http, device(make_body, met=38, missed=2, served={"device": 30, "edge": 10},
                      escalated=10))
    view = http.get("/v1/fleet").json()
    assert [(n["node_id"], n["tier"], n["health"]) for n in view["nodes"]] == [
        ("edge-1", "edge", "healthy"), ("dev-1", "device", "healthy")]
    dev = view["nodes"][1]
    assert (dev["site"], dev["breakers_open"], dev["outbox_pending"]) == ("lab", ["edge-9"], 3)
    traffic = view["traffic"]
    assert traffic["requests"] == 30 and traffic["rate_per_s"] == pytest.approx(3.0)
    assert traffic["sla_attainment"] == pytest.approx(28 / 30, abs=1e-4)
    assert traffic["shares"] == {"device": pytest.approx(20 / 30, abs=1e-4),
                                 "edge": pytest.approx(10 / 30, abs=1e-4)}
    assert traffic["escalation_rate"] == pytest.approx(10 / 30, abs=1e-4)
    (model,) = view["models"]
    assert (model["name"], model["requests"]) == ("fmnist-medium", 20)
    assert model["escalation_rate"] == pytest.approx(8 / 20)
    # the window's answers (10 at 0.65, 10 at 0.95-ish) sit below the version's whole life
    assert model["confidence"] == pytest.approx((10 * 0.65 + 10 * 0.95) / 20, abs=1e-3)
    assert model["drift"] < 0
    assert view["tiers"]["device"] == {"nodes": 1, "healthy": 1, "down": 0}
    assert view["breakers_open"] == 1


def test_a_silent_node_turns_late_then_down_and_a_restart_counts_from_zero(
        http: TestClient, make_body: Any, clock: Any) -> None:
    beat(http, device(make_body, met=100, missed=0, served={"device": 100}, escalated=5))
    beat(http, make_body())
    clock.advance(4)
    beat(http, make_body())
    assert {n["node_id"]: n["health"] for n in http.get("/v1/fleet").json()["nodes"]} == {
        "edge-1": "healthy", "dev-1": "late"}
    clock.advance(4)  # dev-1: 8 s silent, past the TTL
    beat(http, make_body())
    http.app.state.registry.sweep()  # type: ignore[attr-defined]
    nodes = {n["node_id"]: n for n in http.get("/v1/fleet").json()["nodes"]}
    assert nodes["dev-1"]["health"] == "down" and nodes["dev-1"]["age_s"] == pytest.approx(8)
    clock.advance(6)
    beat(http, device(make_body, met=7, missed=0, served={"device": 7}, escalated=0,
                      started_at=1_733_140_010.0))  # restarted: its counts began again
    view = http.get("/v1/fleet").json()
    assert view["traffic"]["requests"] == 7


def test_the_data_needs_the_operator_token_the_page_does_not(store: SqliteRegistryStore,
                                                             clock: Any) -> None:
    identity = IdentityStore(":memory:", admin_token="s3cret-operator-token")
    try:
        http = TestClient(create_app(store, clock=clock, ttl_s=TTL, identity=identity))
        assert http.get("/v1/fleet").status_code == 401
        assert http.get("/v1/fleet/events").status_code == 401
        page = http.get("/ui")
        assert page.status_code == 200 and "tierlink fleet" in page.text
        assert "http://" not in page.text.replace("http://host", "")  # no asset from outside
        assert "<script src" not in page.text and "<link" not in page.text
        ok = http.get("/v1/fleet", headers={"authorization": "Bearer admin:s3cret-operator-token"})
        assert ok.status_code == 200 and ok.json()["nodes"] == []
    finally:
        identity.close()


def test_the_stream_sends_a_snapshot_then_ends_when_the_server_stops(
        store: SqliteRegistryStore, clock: Any, make_body: Any) -> None:
    app = create_app(store, clock=clock, ttl_s=TTL)
    with TestClient(app) as http:
        beat(http, make_body())
        with http.stream("GET", "/v1/fleet/events?interval_s=0.2") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = response.iter_lines()
            data = next(line for line in lines if line.startswith("data: "))
            snapshot = json.loads(data.removeprefix("data: "))
            assert [n["node_id"] for n in snapshot["nodes"]] == ["edge-1"]
            app.state.fleet_view.close()
            rest = list(lines)  # the stream ends instead of hanging
            assert all(not line.startswith("data: ") for line in rest)


def test_agreement_with_the_most_capable_model_per_version_over_the_window(
        http: TestClient, make_body: Any, clock: Any) -> None:
    def mirrored(body: dict[str, Any], n: int, agreed: int) -> dict[str, Any]:
        body = with_stats(body, 100 + n, 0, [0] * 9 + [100 + n])
        body["models"][0]["stats"].update(mirrored=n, agreed=agreed)
        return body

    beat(http, mirrored(make_body(), 40, 40))
    http.get("/v1/fleet")  # the first sample
    clock.advance(10)
    beat(http, mirrored(make_body(), 140, 130))  # 100 more mirrored, 90 of them agreed
    (model,) = http.get("/v1/fleet").json()["models"]
    assert (model["mirrored"], model["agreement"]) == (100, 0.9)


def test_each_node_s_process_its_cpu_share_over_the_window_memory_and_files(
        http: TestClient, make_body: Any, clock: Any) -> None:
    def node(cpu_s: float, **kw: Any) -> dict[str, Any]:
        return make_body(process={"cpu_seconds": cpu_s, "resident_bytes": 150 * 2**20,
                                  "open_fds": 40}, **kw)

    beat(http, node(12.0))
    beat(http, make_body(node_id="dev-1", tier="device", upstream=[], links=[]))  # no /proc
    first = {n["node_id"]: n["process"] for n in http.get("/v1/fleet").json()["nodes"]}
    assert first["edge-1"]["cpu_share"] is None and first["dev-1"] is None  # no window yet
    clock.advance(10)
    beat(http, node(15.0))
    view = {n["node_id"]: n["process"] for n in http.get("/v1/fleet").json()["nodes"]}
    assert view["edge-1"] == {"cpu_share": pytest.approx(0.3), "cpu_seconds": 15.0,
                              "resident_mib": 150.0, "open_fds": 40}
    clock.advance(10)  # restarted: its CPU counts from zero, no share until the next sample
    beat(http, node(0.5, started_at=1_733_139_500.0))
    assert http.get("/v1/fleet").json()["nodes"][0]["process"]["cpu_share"] is None
    bad = node(1.0)
    bad["process"]["open_fds"] = -1
    response = http.post("/v1/nodes/edge-1/heartbeat", json=bad)
    assert response.status_code == 422 and "open_fds" in response.text
