"""Capacity and cost planning: placements that respect privacy and latency, sized on P95
with headroom, costed per month, beside all-cloud and all-edge plans."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierlink.cli.main import app
from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.plan.inventory import load_inventory, parse_inventory
from tierlink.plan.planner import fixed, plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "inventory.yaml"


def test_the_plan_keeps_privacy_and_latency_and_beats_all_cloud() -> None:
    inv = load_inventory(EXAMPLE)
    p, cloud, edge = plan(inv).to_dict(), fixed(inv, Tier.CLOUD).to_dict(), \
        fixed(inv, Tier.EDGE).to_dict()
    assert p["privacy_violations"] == [] and p["sla_misses"] == []
    assert set(cloud["privacy_violations"]) == {"line-inspection", "shelf-audit"}
    assert edge["sla_misses"] == ["returns-triage"]  # no edge box serves the large model
    assert p["monthly_usd"] < cloud["monthly_usd"]
    where = {u["name"]: u["tier"] for u in p["use_cases"]}
    assert where == {"line-inspection": "device", "shelf-audit": "edge",
                     "returns-triage": "cloud", "support-chat": "edge"}


def test_instances_are_sized_on_p95_with_headroom_and_training_on_6nd() -> None:
    inv = load_inventory(EXAMPLE)
    chat = next(u for u in plan(inv).placed if u.use_case == "support-chat")
    # 12 req/s x 1.3 x 200 tokens at 400 tokens/s per box
    assert chat.instances == math.ceil(12 * 1.3 * 200 / 400)
    run = plan(inv).training[0]
    assert run.flops == pytest.approx(6 * 2.1e6 * 6.0e9)
    assert run.gpu_hours == pytest.approx(run.flops / (312e12 * 0.4) / 3600)


@pytest.mark.parametrize("raw", [
    {"use_cases": [{"name": "a", "model": "m", "peak_rps": 1}], "hardware": [],
     "colour": 1},
    {"use_cases": [{"name": "a", "model": "m", "peak_rps": 1, "p95_rps": 2}],
     "hardware": [{"name": "h", "tier": "edge"}]},
    {"use_cases": [{"name": "a", "peak_rps": 1}], "hardware": [{"name": "h", "tier": "edge"}]},
    {"use_cases": [], "hardware": [{"name": "h", "tier": "edge"}]},
    {"use_cases": [{"name": "a", "model": "m", "peak_rps": 1}],
     "hardware": [{"name": "h", "tier": "moon"}]},
])
def test_bad_inventories_are_refused(raw: object) -> None:
    with pytest.raises(ConfigError):
        parse_inventory(raw)


def test_the_cli_prints_and_writes_json() -> None:
    out = CliRunner().invoke(app, ["plan", str(EXAMPLE), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert set(report) >= {"plan", "all_cloud", "all_edge"}
    table = CliRunner().invoke(app, ["plan", str(EXAMPLE)])
    assert "line-inspection" in table.output and "all_edge" in table.output
