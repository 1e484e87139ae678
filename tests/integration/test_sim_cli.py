"""``tierlink sim`` on the demo's fleet file and the real zoo, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_sim_reports_the_demo_runs_side_by_side(tmp_path: Path) -> None:
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    tierlink = Path(sys.executable).parent / "tierlink"
    done = subprocess.run(
        [str(tierlink), "sim", str(ROOT / "src/tierlink/demo/fleets/fleet.yaml"), "--requests",
         "300", "--runs", "tierlink,cloud_only", "--json", str(out), "--png", str(png)],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"tierlink", "cloud_only"}
    routed, cloud = report["runs"]["tierlink"], report["runs"]["cloud_only"]
    assert routed["requests"] == 300 and routed["privacy_violations"] == 0
    # cloud_only plans private inputs to the cloud: the routers refuse them, nothing leaks
    assert cloud["privacy_violations"] == 0 and cloud["privacy_refusals"] > 0
    assert routed["privacy_refusals"] == 0
    assert routed["sla_attainment"] > cloud["sla_attainment"]
    assert abs(routed["accuracy"] - cloud["accuracy"]) < 0.02
    # the demo's photo workload follows, with split plans from the head holder (dev-1)
    photos = routed["imagenet"]
    assert photos["requests"] == 40 and photos["lost"] == 0
    assert photos["served"]["split"] > 0 and set(photos["by_origin"]["dev-1"]) == {"split"}
    assert cloud["imagenet"]["served"]["split"] == 0
    assert "left_out" not in report
    assert png.stat().st_size > 10_000
    bad = subprocess.run([str(tierlink), "sim", "--runs", "best_policy"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode != 0 and "best_policy" in bad.stderr


def test_sim_replays_a_live_log_with_its_measured_http_costs(tmp_path: Path) -> None:
    from tierlink.core.types import Priority, Privacy
    from tierlink.fleet.requestlog import append_log, warm_up_run
    from tierlink.fleet.workload import Record, WorkItem

    records = []
    for i in range(60):  # as `demo --log` writes them: half answered on the device
        item = WorkItem(i, i, f"dev-{1 + i % 4}", 150.0, Priority.INTERACTIVE, Privacy.ANY,
                        0.1 * i)
        local = i % 2 == 0
        records.append(Record(item, 0, True, False, "", 2.5 if local else 16.0,
                              tier="device" if local else "edge",
                              served_by=item.origin if local else "edge-1",
                              timings={"compute_ms": 0.2} if local else {"server_ms": 1.0}))
    log, out = tmp_path / "live.jsonl", tmp_path / "sim.json"
    # the run's warm-up first, as the demo writes it: dearer, and left out unless asked for
    warm = [replace(r, latency_ms=4.2 if r.served_by == r.item.origin else 20.0)
            for r in records[:40]]
    append_log(log, warm_up_run("tierlink"), warm)
    append_log(log, "tierlink", records)
    tierlink = Path(sys.executable).parent / "tierlink"
    done = subprocess.run(
        [str(tierlink), "sim", str(ROOT / "src/tierlink/demo/fleets/fleet.yaml"), "--replay",
         str(log), "--http-from", str(log), "--runs", "device_only", "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["requests"] == 60 and report["replay"] == str(log)
    assert report["http"]["request_ms"] == {"n": 30, "p50": 2.3, "p95": 2.3, "p99": 2.3}
    assert report["runs"]["device_only"]["p50_ms"] > 2.3  # the request's cost + compute
    done = subprocess.run(
        [str(tierlink), "sim", str(ROOT / "src/tierlink/demo/fleets/fleet.yaml"), "--replay",
         str(log), "--http-from", str(log), "--http-warm-up", "--runs", "device_only",
         "--json", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["requests"] == 60  # the measured run is replayed, not its warm-up
    assert report["http"]["request_ms"] == {"n": 20, "p50": 4.0, "p95": 4.0, "p99": 4.0}
    stranger = tmp_path / "other.jsonl"
    append_log(stranger, "x", [Record(WorkItem(0, 0, "phone-9", 30.0, Priority.REALTIME,
                                               Privacy.ANY, 0.0), 0, True, False, "", 1.0)])
    bad = subprocess.run([str(tierlink), "sim", "--replay", str(stranger)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert bad.returncode != 0 and "phone-9" in bad.stderr
