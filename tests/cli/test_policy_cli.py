"""``tierlink policy evaluate|promote`` on shadow logs: estimates with intervals, and a fleet
switched only when the candidate's lower bound beats the acting policy."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from ope_support import synthetic_log as _log
from tierlink.cli.main import app
from tierlink.policy.ope import log_line

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


def test_promote_switches_only_a_better_candidate(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    worse = _write(tmp_path / "worse.jsonl", 2, better=False)
    refused = CliRunner().invoke(app, ["policy", "promote", str(fleet), str(worse)])
    assert refused.exit_code == 1 and "not promoted" in refused.output
    assert fleet.read_text() == FLEET
    better = _write(tmp_path / "better.jsonl", 3)
    dry = CliRunner().invoke(app, ["policy", "promote", str(fleet), str(better), "--dry-run"])
    assert dry.exit_code == 0 and "would promote" in dry.output and fleet.read_text() == FLEET
    done = CliRunner().invoke(app, ["policy", "promote", str(fleet), str(better)])
    assert done.exit_code == 0, done.output
    routing = yaml.safe_load(fleet.read_text())["routing"]
    assert routing["policy"] == "tierlink" and routing["weights"]["cost"] == 0.0
    assert "shadow" not in routing


def test_logs_of_two_candidates_or_garbage_are_refused(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", 4)
    b = _write(tmp_path / "b.jsonl", 5, candidate={"policy": "bandit", "explore": 0.1})
    mixed = CliRunner().invoke(app, ["policy", "evaluate", str(a), str(b)])
    assert mixed.exit_code != 0 and "2 candidate policies" in mixed.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"acting": 1}\n' + a.read_text())
    garbage = CliRunner().invoke(app, ["policy", "evaluate", str(bad)])
    assert garbage.exit_code != 0 and "line 1" in garbage.output
