"""The ``/v1/rollouts`` routes through the real control-plane app (with node identity)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tierlink.cli.errors import admin_headers
from tierlink.control.app import create_app
from tierlink.control.identity import IdentityStore
from tierlink.control.store import SqliteRegistryStore

ADMIN_TOKEN = "operator-token-0123456789"
ADMIN = admin_headers(ADMIN_TOKEN)
MODEL = "fmnist-large"


def heartbeat(node_id: str, active: str = "1", standby: str | None = None,
              weight: float = 0.0) -> dict[str, Any]:
    def entry(version: str, role: str, share: float) -> dict[str, Any]:
        return {"name": MODEL, "task": "fmnist", "version": version, "accuracy": 0.9,
                "latency_ms": 2.0, "role": role, "weight": share,
                "stats": {"requests": 0, "since": 1.0}}
    models = [entry(active, "active", 1.0 - weight)]
    if standby is not None:
        models.append(entry(standby, "standby", weight))
    return {"node_id": node_id, "tier": "edge", "address": "http://127.0.0.1:8101",
            "models": models, "started_at": 1.0}


@pytest.fixture
def http(tmp_path: Path, clock: Any) -> Iterator[TestClient]:
    db = tmp_path / "control.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, ADMIN_TOKEN)
    app = create_app(registry, clock=clock, identity=identity, rollout_interval_s=0.05)
    try:
        with TestClient(app) as client:
            yield client
    finally:
        identity.close()
        registry.close()


def beat(http: TestClient, node_id: str, **kwargs: Any) -> dict[str, Any]:
    response = http.post(f"/v1/nodes/{node_id}/heartbeat", json=heartbeat(node_id, **kwargs),
                         headers=ADMIN)
    assert response.status_code == 200, response.text
    return dict(response.json())


def start(http: TestClient, **fields: Any) -> Any:
    body = {"name": MODEL, "version": "2", "tier": "edge", "canary": 0.1, "soak_s": 60,
            **fields}
    return http.post("/v1/rollouts", json=body, headers=ADMIN)


def test_rollouts_are_for_operators_only(http: TestClient) -> None:
    assert http.get("/v1/rollouts").status_code == 401
    token = http.post("/v1/enrollment-tokens", json={}, headers=ADMIN).json()["token"]
    secret = http.post("/v1/enroll", json={"token": token, "node_id": "edge-1",
                                           "tier": "edge"}).json()["secret"]
    node = {"authorization": f"Bearer node:edge-1:{secret}"}
    assert http.get("/v1/rollouts", headers=node).status_code == 403
    assert http.post("/v1/rollouts/1/rollback", headers=node).status_code == 403
    assert http.get("/v1/rollouts", headers=ADMIN).json()["rollouts"] == []


def test_start_and_the_heartbeat_answer_carries_desired(http: TestClient) -> None:
    assert beat(http, "edge-1")["desired"] == {}
    beat(http, "edge-2")
    response = start(http)
    assert response.status_code == 201, response.text
    record = response.json()
    assert record["phase"] == "deploying" and record["spec"]["previous"] == "1"
    canary = next(a for a in record["assignments"] if a["version"] == "2")
    assert canary["weight"] == pytest.approx(0.2)
    answer = beat(http, canary["node_id"])
    assert answer["desired"] == {MODEL: {"version": "2", "weight": 0.2}}
    assert set(answer) == {"node_id", "generation", "registered_at", "ttl_s", "desired",
                           "draining"}

    # The background tick sees the node hold the version and starts the soak.
    beat(http, canary["node_id"], standby="2", weight=0.2)
    deadline = time.monotonic() + 10
    while http.get(f"/v1/rollouts/{record['id']}", headers=ADMIN).json()["phase"] != "soaking":
        assert time.monotonic() < deadline, "the rollout task never moved the rollout"
        time.sleep(0.02)
    assert 'tierlink_rollout_transitions_total{from_phase="deploying",model="fmnist-large",' \
           'to_phase="soaking"} 1.0' in http.get("/metrics").text


def test_errors(http: TestClient) -> None:
    for path in ("/v1/rollouts/42", "/v1/rollouts/abc", "/v1/rollouts/99999999999999999999"):
        missing = http.get(path, headers=ADMIN)
        assert missing.status_code == 404 and missing.json()["code"] == "rollout_not_found"
    assert http.post("/v1/rollouts/42/pause", headers=ADMIN).status_code == 404

    nobody = start(http)
    assert nobody.status_code == 409 and "no alive edge node" in nobody.json()["error"]
    beat(http, "edge-1")
    unknown = start(http, colour="red")
    assert unknown.status_code == 400 and "colour" in unknown.json()["error"]
    assert "invalid rollout request" in unknown.json()["error"]
    bad = start(http, stages=[0.5, 0.2, 1.0], canary=None)
    assert bad.status_code == 400 and "stages" in bad.json()["error"]

    first = start(http).json()["id"]
    again = start(http, version="3")
    assert again.status_code == 409 and again.json()["code"] == "rollout_error"
    paused = http.post(f"/v1/rollouts/{first}/pause", json={"reason": "lunch"},
                       headers=ADMIN)
    assert paused.status_code == 200 and paused.json()["phase"] == "paused"
    twice = http.post(f"/v1/rollouts/{first}/pause", headers=ADMIN)
    assert twice.status_code == 409 and "cannot pause" in twice.json()["error"]
    assert http.post(f"/v1/rollouts/{first}/explode", headers=ADMIN).status_code == 404
    done = http.post(f"/v1/rollouts/{first}/rollback", headers=ADMIN).json()
    assert done["phase"] == "rolled_back"
    record = http.get(f"/v1/rollouts/{first}", headers=ADMIN).json()
    assert [t["to"] for t in record["transitions"]] == ["deploying", "paused", "rolled_back"]
    assert "lunch" in record["transitions"][1]["reason"]
    listed = http.get("/v1/rollouts", params={"model": MODEL}, headers=ADMIN).json()
    assert [r["id"] for r in listed["rollouts"]] == [first]


def test_without_a_rollout_store_the_routes_say_so(clock: Any) -> None:
    registry = SqliteRegistryStore(":memory:")
    try:
        with TestClient(create_app(registry, clock=clock, rollouts=False)) as http:
            response = http.get("/v1/rollouts")
            assert response.status_code == 503 and "no rollout store" in response.json()["error"]
            answer = http.post("/v1/nodes/edge-1/heartbeat", json=heartbeat("edge-1"))
            assert answer.json()["desired"] == {}
    finally:
        registry.close()


def test_the_rollout_task_survives_failing_ticks(
        http: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    controller = http.app.state.rollouts  # type: ignore[attr-defined]
    calls: list[float] = []

    def failing_tick() -> None:
        calls.append(time.monotonic())
        if len(calls) <= 3:
            raise OSError("disk on fire")

    controller.tick = failing_tick
    deadline = time.monotonic() + 10
    with caplog.at_level(logging.ERROR, logger="tierlink.control.app"):
        while len(calls) < 6:
            assert time.monotonic() < deadline, "the rollout task stopped ticking"
            time.sleep(0.02)
    failures = [r for r in caplog.records if "rollout tick failed" in r.getMessage()]
    assert len(failures) == 1  # once per failure streak
