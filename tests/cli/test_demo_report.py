"""The demo's printed report: the Fashion-MNIST table and, when the fleet has a photo
workload, its table of split plans (built from the same summaries the JSON holds)."""

import json
from pathlib import Path

import pytest

from tierlink.cli import demo as cli_demo
from tierlink.core.types import Priority, Privacy
from tierlink.fleet.config import load_fleet
from tierlink.fleet.demo import breakdown
from tierlink.fleet.workload import Record, WorkItem, summarize, summarize_split

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"


def rec(origin: str, split: str = "", served_by: str = "edge-1", answered: bool = True,
        error: str = "") -> Record:
    item = WorkItem(0, 0, origin, 500.0, Priority.INTERACTIVE, Privacy.SITE, 0.0)
    timings = ({"head_ms": 11.0, "encode_ms": 0.5, "tail_rtt_ms": 40.0, "split_bytes": 50331.0,
                "est_ms": 38.0} if split else {})
    return Record(item, 3, answered, False, error, 70.0, pred=3, tier="edge",
                  served_by=served_by if answered else "", split=split, timings=timings)


def report(with_photos: bool) -> dict:
    records = [rec("dev-1", served_by="dev-1")]
    fmnist = summarize(records, 0) | breakdown(records, load_fleet(EXAMPLE), None)
    photos = {"model": "imagenet-mobilenetv2", "origins": ["dev-1", "dev-2"],
              "head_holders": ["dev-1"],
              "open_heads": {"dev-1": ["features.4"]},
              **summarize_split([rec("dev-1", "features.4/fp16"), rec("dev-1", "features.2/fp16"),
                                 rec("dev-2"), rec("dev-2", answered=False,
                                                   error="deadline_exceeded")], 0)}
    runs = {name: {**fmnist, **({"imagenet": photos} if with_photos else {})}
            for name in ("tierlink", "static_rules", "cloud_only", "device_only")}
    return {"runs": runs, "thresholds": {}, "fleet": {},
            "hard_examples": {"stored": 0, "by_privacy": {}, "wrong_share_of_labelled": None},
            "environment": {"device_cpu_throttle": "none", "requests_per_run": 1,
                            "rate_per_s": 1.0}}


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """Four runs side by side: a terminal wide enough that no cell wraps."""
    monkeypatch.setenv("COLUMNS", "160")


def test_the_photo_table_shows_split_plans_and_latency_by_kind(capsys):
    data = report(with_photos=True)
    json.dumps(data)  # what --json writes
    cli_demo._print_report(data)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "imagenet-mobilenetv2 on photos" in text
    assert "features.4/fp16" in text and "+1 other" in text  # the top plan, then others
    assert "2/0/1" in text  # split / local / remote
    assert "38/40" in text  # the policy's estimate after the head / measured
    assert "deadline_exceeded x1" in text and "dev-1 may split" in text
    assert "dev-2: the raw photo is uploaded" in text


def test_without_a_photo_workload_the_report_is_as_before(capsys):
    cli_demo._print_report(report(with_photos=False))
    out = capsys.readouterr()
    assert "on photos" not in out.out + out.err
    assert "served on device/edge/cloud" in out.out


def test_the_breakdown_table_shows_each_privacy_level_and_sla_class(capsys):
    cli_demo._print_report(report(with_photos=False))
    out = capsys.readouterr().out
    assert "by privacy level and SLA class" in out
    assert "privacy site" in out and "interactive (500 ms)" in out
    assert "static_rules" in out
