"""``tierlink sim`` on the demo's fleet file and the real zoo, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_sim_reports_the_demo_runs_side_by_side(tmp_path: Path) -> None:
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    tierlink = Path(sys.executable).parent / "tierlink"
    done = subprocess.run(
        [str(tierlink), "sim", str(ROOT / "src/tierlink/examples/fleet.yaml"), "--requests",
         "300", "--runs", "tierlink,cloud_only", "--json", str(out), "--png", str(png)],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"tierlink", "cloud_only"}
    routed, cloud = report["runs"]["tierlink"], report["runs"]["cloud_only"]
    assert routed["requests"] == 300 and routed["privacy_violations"] == 0
    assert cloud["privacy_violations"] > 0
    assert routed["sla_attainment"] > cloud["sla_attainment"]
    assert abs(routed["accuracy"] - cloud["accuracy"]) < 0.02
    assert "imagenet-mobilenetv2" in report["left_out"]["models"]
    assert png.stat().st_size > 10_000
    bad = subprocess.run([str(tierlink), "sim", "--runs", "best_policy"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode != 0 and "best_policy" in bad.stderr
