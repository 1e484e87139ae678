"""``tierlink policy``: evaluate and promote on shadow logs (estimates with intervals; a
fleet switched only when the candidate's lower bound beats the acting policy), and the running
fleet's routing revisions (apply, promote, revert, history) against the in-process control
plane (the real app with operator identity, reached through a TestClient)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from ope_support import synthetic_log as _log
from tierlink.cli import operator
from tierlink.cli.main import app
from tierlink.control.app import create_app
from tierlink.control.identity import IdentityStore
from tierlink.control.store import SqliteRegistryStore
from tierlink.policy.ope import log_line

ADMIN = ["--control", "http://control", "--admin-token", "operator-token-0123456789"]

FLEET = """name: f
routing:
  policy: tierlink
  shadow: {policy: tierlink, weights: {cost: 0.0}, explore: 0.2}
nodes:
  - {id: dev-1, tier: device, models: [m]}
"""
CANDIDATE = {"policy": "tierlink", "explore": 0.2,
             "weights": {"accuracy": 1.0, "latency": 1.0, "cost": 0.0}}


def _write(path: Path, seed: int, better: bool = True, candidate: dict = CANDIDATE) -> Path:
    log, _ = _log(4000, 0.2, seed)
    if not better:  # the candidate's choice is the worse option: swap the rewards' meaning
        log = [e.__class__(e.acting, e.candidate, e.propensity, -e.reward, e.acting_features,
                           e.candidate_features) for e in log]
    path.write_text("".join(log_line(e, candidate) + "\n" for e in log))
    return path


def test_evaluate_reports_both_estimators(tmp_path: Path) -> None:
    log = _write(tmp_path / "a.jsonl", 1)
    result = CliRunner().invoke(app, ["policy", "evaluate", str(log), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["decisions"] == 4000 and report["candidate_policy"] == CANDIDATE
    c = report["candidate"]
    assert c["ci_low"] < c["estimate"] < c["ci_high"]
    table = CliRunner().invoke(app, ["policy", "evaluate", str(log)])
    assert "doubly robust" in table.output


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    db = tmp_path / "control.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, ADMIN[-1])
    try:
        with TestClient(create_app(registry, identity=identity)) as client:
            monkeypatch.setattr(operator, "http_client",
                                lambda url: contextlib.nullcontext(client))
            yield client
    finally:
        identity.close()
        registry.close()


def policy(*args: str) -> object:
    return CliRunner().invoke(app, ["policy", *args, *ADMIN])


def test_promote_switches_only_a_better_candidate(tmp_path: Path,
                                                  control: TestClient) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    started = policy("apply", str(fleet), "--note", "tierlink up", "--json")
    assert started.exit_code == 0, started.output
    worse = _write(tmp_path / "worse.jsonl", 2, better=False)
    refused = policy("promote", str(fleet), str(worse))
    assert refused.exit_code == 1 and "not promoted" in refused.output
    assert fleet.read_text() == FLEET
    better = _write(tmp_path / "better.jsonl", 3)
    dry = policy("promote", str(fleet), str(better), "--dry-run")
    assert dry.exit_code == 0 and "would promote" in dry.output and fleet.read_text() == FLEET
    done = policy("promote", str(fleet), str(better))
    assert done.exit_code == 0, done.output
    routing = yaml.safe_load(fleet.read_text())["routing"]
    assert routing["policy"] == "tierlink" and routing["weights"]["cost"] == 0.0
    assert "shadow" not in routing
    # ... and the running fleet took it as its next revision
    live = control.get("/v1/routing", headers={"authorization": f"Bearer admin:{ADMIN[-1]}"})
    current = live.json()["current"]
    assert current["revision"] == 2 and current["note"] == "promote"
    assert current["routing"]["weights"]["cost"] == 0.0 and "shadow" not in current["routing"]


def test_apply_revert_and_history_change_the_running_fleets_routing(
        tmp_path: Path, control: TestClient) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    first = json.loads(policy("apply", str(fleet), "--json").output)
    assert first["revision"] == 1 and first["routing"]["policy"] == "tierlink"
    fleet.write_text(FLEET.replace("policy: tierlink\n", "policy: {name: bandit, options: "
                                                           "{prior_weight: 4}}\n"))
    second = json.loads(policy("apply", str(fleet), "--json", "--note", "try the bandit").output)
    assert second["revision"] == 2
    assert second["routing"]["policy"] == {"name": "bandit", "options": {"prior_weight": 4}}
    back = json.loads(policy("revert", "--json").output)
    assert back["revision"] == 3 and back["routing"] == first["routing"]
    assert back["note"] == "revert to 1"
    history = json.loads(policy("history", "--json").output)
    assert [r["revision"] for r in history["history"]] == [3, 2, 1]
    assert "try the bandit" in policy("history").output


@pytest.mark.parametrize(("change", "message"), [
    ("policy: tierlink\n", "unknown policy"),
    ("shadow: {policy: tierlink", "takes no option"),
    ("  policy: tierlink\n", "routing.hedging cannot change on a running fleet"),
])
def test_a_revision_that_cannot_be_run_live_is_refused_naming_why(
        tmp_path: Path, control: TestClient, change: str, message: str) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    assert policy("apply", str(fleet)).exit_code == 0
    bad = {"unknown policy": FLEET.replace(change, "policy: tierlnk\n"),
           "takes no option": FLEET.replace(change, "shadow: {policy: {name: tierlink, "
                                                    "options: {x: 1}}"),
           "routing.hedging cannot change on a running fleet": FLEET.replace(
               change, change + "  hedging: {enabled: false}\n")}[message]
    fleet.write_text(bad)
    refused = policy("apply", str(fleet))
    assert refused.exit_code != 0 and message in refused.output, refused.output
    assert len(json.loads(policy("history", "--json").output)["history"]) == 1


def test_logs_of_two_candidates_or_garbage_are_refused(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", 4)
    b = _write(tmp_path / "b.jsonl", 5, candidate={"policy": "bandit", "explore": 0.1})
    mixed = CliRunner().invoke(app, ["policy", "evaluate", str(a), str(b)])
    assert mixed.exit_code != 0 and "2 candidate policies" in mixed.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"acting": 1}\n' + a.read_text())
    garbage = CliRunner().invoke(app, ["policy", "evaluate", str(bad)])
    assert garbage.exit_code != 0 and "line 1" in garbage.output
