"""``tierlink rollout start|status|promote|rollback|pause|resume`` against the in-process
control plane (the real app with node identity, reached through a TestClient)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tierlink.cli import operator, rollout
from tierlink.cli.errors import admin_headers
from tierlink.cli.rollout import parse_duration, parse_share, parse_stages
from tierlink.control.app import create_app
from tierlink.control.identity import IdentityStore
from tierlink.control.store import SqliteRegistryStore
from tierlink.errors import ConfigError

URL = "http://control"
ADMIN_TOKEN = "operator-token-0123456789"
MODEL = "fmnist-large"
runner = CliRunner()


def cli() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(rollout.app, name="rollout")
    return root


def heartbeat(node_id: str) -> dict[str, Any]:
    return {"node_id": node_id, "tier": "edge", "address": "http://127.0.0.1:8101",
            "started_at": 1.0, "labels": {"hw": "a" if node_id == "edge-1" else "b"},
            "models": [{"name": MODEL, "task": "fmnist", "version": "1", "accuracy": 0.9,
                        "latency_ms": 2.0}]}


@pytest.fixture
def http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    db = tmp_path / "control.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, ADMIN_TOKEN)
    try:
        with TestClient(create_app(registry, identity=identity)) as client:
            monkeypatch.setattr(operator, "http_client",
                                lambda url: contextlib.nullcontext(client))
            for node in ("edge-1", "edge-2"):
                client.post(f"/v1/nodes/{node}/heartbeat", json=heartbeat(node),
                            headers=admin_headers(ADMIN_TOKEN))
            yield client
    finally:
        identity.close()
        registry.close()


def invoke(*args: str, token: str = ADMIN_TOKEN) -> Any:
    env = {"COLUMNS": "250", "TIERLINK_ADMIN_TOKEN": token, "TIERLINK_CONTROL_URL": URL}
    return runner.invoke(cli(), ["rollout", *args], env=env)


def test_shares_and_durations_parse() -> None:
    assert parse_share("10%") == pytest.approx(0.1) and parse_share("0.1") == 0.1
    assert parse_share("1") == 1.0
    assert parse_stages("10%,50%,100%") == pytest.approx([0.1, 0.5, 1.0])
    for bad in ("10", "0%", "ten", "-0.5"):
        with pytest.raises(ConfigError, match="share"):
            parse_share(bad)
    assert parse_duration("60s") == 60 and parse_duration("2m") == 120
    assert parse_duration("90") == 90 and parse_duration("500ms") == pytest.approx(0.5)
    assert parse_duration("1h") == 3600 and parse_duration(" 1.5 m ") == 90
    with pytest.raises(ConfigError, match="duration"):
        parse_duration("soon")


def test_start_status_and_actions(http: TestClient) -> None:
    started = invoke("start", MODEL, "2", "--tier", "edge", "--canary", "10%", "--soak", "60s",
                     "--min-requests", "50", "--json")
    assert started.exit_code == 0, started.output
    record = json.loads(started.stdout)
    assert record["spec"]["soak_s"] == 60 and record["spec"]["stages"] == [0.1, 0.5, 1.0]
    assert record["spec"]["min_requests"] == 50 and record["phase"] == "deploying"

    table = invoke("status")
    assert table.exit_code == 0, table.output
    for text in ("fmnist-large", "deploying", "1/3 (10%)", "10%", "edge-"):
        assert text in table.stdout
    detail = invoke("status", MODEL)  # a model name: its latest rollout
    assert detail.exit_code == 0 and "assignments" in detail.stdout
    assert "transitions" in detail.stdout and "weight 0.20" in detail.stdout

    paused = invoke("pause", "1", "--reason", "looking at dashboards")
    assert paused.exit_code == 0 and "looking at dashboards" in paused.stdout
    assert invoke("resume", "1").exit_code == 0
    promoted = invoke("promote", "1", "--json")
    assert json.loads(promoted.stdout)["state"]["stage"] == 1
    back = invoke("rollback", MODEL, "--reason", "bad canary")
    assert back.exit_code == 0 and "rolled_back" in back.stdout
    listed = json.loads(invoke("status", "--json").stdout)
    assert [r["phase"] for r in listed] == ["rolled_back"]


def test_errors_exit_2_with_message_and_hint(http: TestClient) -> None:
    both = invoke("start", MODEL, "2", "--tier", "edge", "--canary", "10%", "--stages", "0.5,1")
    assert both.exit_code == 2 and "not both" in both.output
    assert invoke("start", MODEL, "2", "--tier", "edge").exit_code == 0
    again = invoke("start", MODEL, "3", "--tier", "edge")
    assert again.exit_code == 2 and "already has a live rollout" in again.output
    assert "hint" in again.output
    missing = invoke("pause", "42")
    assert missing.exit_code == 2 and "no rollout with id 42" in missing.output
    unknown = invoke("status", "no-such-model")
    assert unknown.exit_code == 2 and "no rollout of model" in unknown.output
    nobody = invoke("start", "other-model", "2", "--tier", "cloud")
    assert nobody.exit_code == 2 and "no alive cloud node" in nobody.output
    wrong = invoke("status", token="x" * 24)
    assert wrong.exit_code == 2 and "admin token" in wrong.output


def test_help_names_the_model_argument() -> None:
    result = runner.invoke(cli(), ["rollout", "start", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "as `tierlink model list` shows it" in " ".join(result.stdout.split())


def test_a_rollout_cohort_by_cohort_from_the_command_line(http: TestClient) -> None:
    started = invoke("start", MODEL, "2", "--tier", "edge", "--cohort", "hw=a",
                     "--cohort", "hw=b", "--json")
    assert started.exit_code == 0, started.output
    record = json.loads(started.stdout)
    assert record["spec"]["selector"] == {"hw": "a"}
    assert record["spec"]["cohorts"] == [{"hw": "b"}]
    assert {a["node_id"] for a in record["assignments"]} == {"edge-1"}
    table = invoke("status")
    assert "hw=a" in table.stdout, table.output
    bad = invoke("start", "other", "2", "--tier", "edge", "--cohort", "hw")
    assert bad.exit_code == 2 and "label=value" in bad.output
