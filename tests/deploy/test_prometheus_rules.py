"""The alerting and recording rules in deploy/rules: valid for Prometheus (`promtool check
rules`), behaving as their unit tests say (`promtool test rules`: an SLA below target
pages, a node down pages after a minute, a breaker open for ten minutes, a growing outbox
backlog, a rolled-back canary, an escalation rate off its norm; the bill's: a path's cost
per request three times its 24-hour p99, transfer over 30% of an hour's bill, devices'
energy per request twice its daily norm; a model version agreeing with the most capable
model significantly less than its model's daily norm — each with series that fire and
series that do not), and over series the code really exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "rules"


def promtool() -> str:
    found = shutil.which("promtool") or "/usr/bin/promtool"
    assert Path(found).exists(), "promtool is missing: apt-get install -y prometheus"
    return found


def test_the_rules_are_valid_prometheus_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES / "tierlink.rules.yml")],
                          capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 22 rules found" in done.stdout


def test_the_rules_do_what_their_unit_tests_say() -> None:
    done = subprocess.run([promtool(), "test", "rules", "tierlink.rules.test.yml",
                           "tierlink.bill.rules.test.yml"],
                          cwd=RULES, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_series_a_rule_or_the_dashboard_reads_is_one_the_code_exports() -> None:
    rules = (RULES / "tierlink.rules.yml").read_text() + \
        (ROOT / "deploy" / "grafana-dashboard.json").read_text()
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "tierlink").rglob("*.py"))
    used = {re.sub(r"_(bucket|total)$", "", name)
            for name in re.findall(r"\btierlink_[a-z_]+", rules)}
    missing = sorted(name for name in used if f'"{name}' not in source)
    assert used and missing == []
