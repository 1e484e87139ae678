from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tierlink.control.app import create_app
from tierlink.control.store import SqliteRegistryStore
from tierlink.errors import ConfigError, ControlPlaneError

TTL = 5.0


@pytest.fixture
def app(store, clock):
    return create_app(store, clock=clock, ttl_s=TTL)


@pytest.fixture
def http(app) -> TestClient:
    # Not entered as a context manager: no lifespan, so no background sweep; tests that
    # need expiry call app.state.registry.sweep() themselves, on the fake clock.
    return TestClient(app)


def beat(http: TestClient, body: dict, node_id: str | None = None):
    return http.post(f"/v1/nodes/{node_id or body['node_id']}/heartbeat", json=body)


def samples(http: TestClient) -> dict[tuple[str, tuple], float]:
    text = http.get("/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_heartbeat_registers_and_acknowledges(http, make_body, clock):
    response = beat(http, make_body())
    assert response.status_code == 200
    assert response.json() == {"node_id": "edge-1", "generation": 1,
                               "registered_at": clock.now, "ttl_s": TTL, "desired": {},
                               "draining": False}


def test_list_returns_records_with_registry_fields(http, make_body, clock):
    beat(http, make_body(node_id="edge-2", zone="eu-1"))
    beat(http, make_body(node_id="edge-1"))
    clock.advance(1.5)
    payload = http.get("/v1/nodes").json()
    assert payload["ttl_s"] == TTL and payload["now"] == clock.now
    assert [n["node_id"] for n in payload["nodes"]] == ["edge-1", "edge-2"]
    second = payload["nodes"][1]
    assert second["extra"] == {"zone": "eu-1"}
    assert second["age_s"] == pytest.approx(1.5) and second["generation"] == 1
    assert second["models"][0]["cascade"][0]["threshold"] == 0.9
    assert http.get("/v1/nodes/edge-2").json() == second


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.update(tier="fog"), "tier"),
        (lambda b: b["models"][0].update(accuracy=1.5), "models[0].accuracy"),
        (lambda b: b["links"][0].pop("rtt_ms"), "links[0].rtt_ms"),
        (lambda b: b.update(upstream=["ok", "NOT OK"]), "upstream[1]"),
    ],
)
def test_validation_errors_name_the_field(http, make_body, mutate, field):
    body = make_body()
    mutate(body)
    response = beat(http, body)
    assert response.status_code == 422
    error = response.json()
    assert error["code"] == "invalid_request" and error["hint"]
    assert f"invalid heartbeat: {field}: " in error["error"]


def test_a_bad_node_id_in_path_and_body_is_named(http, make_body):
    response = beat(http, make_body(node_id="Bad Id"), node_id="Bad Id")
    assert response.status_code == 422
    assert "node_id" in response.json()["error"]


def test_malformed_json_is_an_error_body(http):
    response = http.post("/v1/nodes/edge-1/heartbeat", content=b"{not json",
                         headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert set(response.json()) == {"error", "code", "hint"}


def test_path_and_body_ids_must_match(http, make_body):
    response = beat(http, make_body(node_id="edge-1"), node_id="edge-2")
    assert response.status_code == 422
    message = response.json()["error"]
    assert "node_id" in message and "'edge-1'" in message and "'edge-2'" in message
    assert http.get("/v1/nodes").json()["nodes"] == []


def test_expiry_follows_the_injected_clock(app, http, make_body, clock):
    beat(http, make_body())
    clock.advance(TTL + 0.5)
    # Listed no more as soon as it is too old, before any sweep ran.
    assert http.get("/v1/nodes").json()["nodes"] == []
    missing = http.get("/v1/nodes/edge-1")
    assert missing.status_code == 404 and missing.json()["code"] == "node_not_found"
    assert app.state.registry.sweep() == ["edge-1"]
    assert samples(http)[("tierlink_control_expired_total", ())] == 1.0
    # It comes back as a new incarnation.
    assert beat(http, make_body()).json()["generation"] == 2


def test_deregistration(http, make_body):
    beat(http, make_body())
    assert http.delete("/v1/nodes/edge-1").status_code == 204
    assert http.get("/v1/nodes/edge-1").status_code == 404
    again = http.delete("/v1/nodes/edge-1")
    assert again.status_code == 404 and "edge-1" in again.json()["error"]


def test_healthz(http, make_body):
    beat(http, make_body())
    assert http.get("/healthz").json() == {"status": "ok", "nodes": 1}


def test_metrics_exposition(http, make_body):
    beat(http, make_body(node_id="edge-1"))
    beat(http, make_body(node_id="edge-2"))
    beat(http, make_body(node_id="cloud-1", tier="cloud", upstream=[], links=[]))
    http.get("/v1/nodes")
    got = samples(http)
    assert got[("tierlink_control_nodes", (("tier", "edge"),))] == 2.0
    assert got[("tierlink_control_nodes", (("tier", "cloud"),))] == 1.0
    assert got[("tierlink_control_nodes", (("tier", "device"),))] == 0.0
    assert got[("tierlink_control_heartbeats_total", ())] == 3.0
    count = ("tierlink_control_request_duration_seconds_count",
             (("method", "GET"), ("route", "/v1/nodes"), ("status", "200")))
    assert got[count] == 1.0
    heartbeat_routes = {labels for name, labels in got if "duration" in name
                        and ("route", "/v1/nodes/{node_id}/heartbeat") in labels}
    assert heartbeat_routes  # the route template, never the raw path


def test_metrics_are_per_app(store, clock, make_body):
    first = TestClient(create_app(store, clock=clock))
    second = TestClient(create_app(store, clock=clock))
    beat(first, make_body())
    assert samples(first)[("tierlink_control_heartbeats_total", ())] == 1.0
    assert samples(second)[("tierlink_control_heartbeats_total", ())] == 0.0


@pytest.mark.skipif(shutil.which("promtool", path="/usr/bin") is None,
                    reason="promtool not installed")
def test_promtool_accepts_the_exposition(http, make_body):
    beat(http, make_body())
    text = http.get("/metrics").text
    result = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=text,
                            check=False, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


class BrokenStore(SqliteRegistryStore):
    """A store whose reads fail, and whose expiry fails a given number of times."""

    def __init__(self, *, fail_reads: bool = False, expire_failures: int = 0) -> None:
        super().__init__(":memory:")
        self.fail_reads = fail_reads
        self.expire_failures = expire_failures
        self.expire_calls = 0

    def alive(self, now, ttl_s):
        if self.fail_reads:
            raise ControlPlaneError("registry database :memory: failed to list nodes: disk I/O")
        return super().alive(now, ttl_s)

    def alive_json(self, now, ttl_s, **kwargs):
        if self.fail_reads:
            raise ControlPlaneError("registry database :memory: failed to list nodes: disk I/O")
        return super().alive_json(now, ttl_s, **kwargs)

    def expire(self, now, ttl_s):
        self.expire_calls += 1
        if self.expire_calls <= self.expire_failures:
            raise ControlPlaneError("registry database :memory: failed to expire: locked")
        return super().expire(now, ttl_s)


def test_store_failures_are_503_with_an_error_body(clock):
    store = BrokenStore(fail_reads=True)
    try:
        response = TestClient(create_app(store, clock=clock)).get("/v1/nodes")
        assert response.status_code == 503
        body = response.json()
        assert body["code"] == "control_plane_error" and "disk I/O" in body["error"]
        assert body["hint"]
    finally:
        store.close()


def test_lifespan_sweeps_and_survives_errors_then_stops_cleanly(clock, make_body):
    store = BrokenStore(expire_failures=2)
    app = create_app(store, clock=clock, ttl_s=TTL, sweep_interval_s=0.01)
    try:
        with TestClient(app) as http:
            beat(http, make_body())
            clock.advance(TTL + 1)
            deadline = time.monotonic() + 10
            while samples(http)[("tierlink_control_expired_total", ())] < 1:
                assert time.monotonic() < deadline, "the sweep never expired the node"
                time.sleep(0.01)
            assert store.expire_calls >= 3  # two failures did not stop it
            task = app.state.sweep_task
            assert not task.done()
        assert task.cancelled()
    finally:
        store.close()


def test_bad_settings_are_config_errors(store):
    with pytest.raises(ConfigError, match="ttl_s"):
        create_app(store, ttl_s=0)


def test_drain_marks_the_node_for_its_peers_and_its_heartbeat_answer(http, make_body):
    beat(http, make_body())
    assert http.post("/v1/nodes/edge-9/drain").status_code == 404
    answer = http.post("/v1/nodes/edge-1/drain").json()
    assert answer == {"node_id": "edge-1", "draining": True, "changed": True}
    assert http.get("/v1/nodes").json()["nodes"][0]["draining"] is True
    assert beat(http, make_body()).json()["draining"] is True
    assert http.delete("/v1/nodes/edge-1/drain").json()["changed"] is True
    assert http.get("/v1/nodes/edge-1").json()["draining"] is False
