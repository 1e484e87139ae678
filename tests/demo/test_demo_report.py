"""The demo's printed report: the Fashion-MNIST table and, when the fleet has a photo
workload, its table of split plans (built from the same summaries the JSON holds)."""

import json
from pathlib import Path

import pytest

from tierlink.core.types import Priority, Privacy
from tierlink.demo import run as demo_run
from tierlink.demo.fleets import fleet_path
from tierlink.fleet.breakdown import breakdown
from tierlink.fleet.config import load_fleet
from tierlink.fleet.workload import PrivacyTally, Record, WorkItem, summarize, summarize_split

EXAMPLE = fleet_path()


def rec(origin: str, split: str = "", served_by: str = "edge-1", answered: bool = True,
        error: str = "") -> Record:
    item = WorkItem(0, 0, origin, 500.0, Priority.INTERACTIVE, Privacy.SITE, 0.0)
    timings = ({"head_ms": 11.0, "encode_ms": 0.5, "tail_rtt_ms": 40.0, "split_bytes": 50331.0,
                "est_ms": 38.0} if split else {})
    return Record(item, 3, answered, False, error, 70.0, pred=3, tier="edge",
                  served_by=served_by if answered else "", split=split, timings=timings)


def report(with_photos: bool) -> dict:
    records = [rec("dev-1", served_by="dev-1")]
    fmnist = summarize(records) | breakdown(records, load_fleet(EXAMPLE), None)
    photos = {"model": "imagenet-mobilenetv2", "origins": ["dev-1", "dev-2"],
              "head_holders": ["dev-1"],
              "open_heads": {"dev-1": ["features.4"]},
              **summarize_split([rec("dev-1", "features.4/fp16"), rec("dev-1", "features.2/fp16"),
                                 rec("dev-2"), rec("dev-2", answered=False,
                                                   error="deadline_exceeded")])}
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
    demo_run._print_report(data)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "imagenet-mobilenetv2 on photos" in text
    assert "features.4/fp16" in text and "+1 other" in text  # the top plan, then others
    assert "2/0/1" in text  # split / local / remote
    assert "38/40" in text  # the policy's estimate after the head / measured
    assert "deadline_exceeded x1" in text and "dev-1 may split" in text
    assert "dev-2: the raw photo is uploaded" in text


def test_without_a_photo_workload_the_report_is_as_before(capsys):
    demo_run._print_report(report(with_photos=False))
    out = capsys.readouterr()
    assert "on photos" not in out.out + out.err
    assert "served on device/edge/cloud" in out.out


def test_the_breakdown_table_shows_each_privacy_level_and_sla_class(capsys):
    demo_run._print_report(report(with_photos=False))
    out = capsys.readouterr().out
    assert "by privacy level and SLA class" in out
    assert "privacy site" in out and "interactive (500 ms)" in out
    assert "static_rules" in out


def test_each_run_is_warmed_up_right_before_it_and_the_log_keeps_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up's requests (the run's first seconds, answers dropped) go out right before
    the run's own, and ``--log`` keeps them apart as ``warm-up:<run>``."""
    from types import SimpleNamespace

    from tierlink.demo.phases import DemoSettings
    from tierlink.fleet.requestlog import measured, read_runs, warm_ups

    sent = _answered_on_the_device(monkeypatch)
    items = [WorkItem(i, i, "dev-1", 150.0, Priority.INTERACTIVE, Privacy.SITE, 0.5 * i)
             for i in range(10)]  # 3 s of warm-up: the first six
    test = SimpleNamespace(input=None, labels=None)
    fleet = SimpleNamespace(config=load_fleet(EXAMPLE))
    log = tmp_path / "requests.jsonl"
    run = demo_run._one_run(fleet, "device_only", "device_only", items, test,
                            DemoSettings.quick(), None, None, log)
    assert sent == [("device_only", 6, False), ("device_only", 10, True)]
    assert run["requests"] == 10
    runs = read_runs(log)
    assert [len(e) for e in measured(runs).values()] == [10]
    assert {name: len(e) for name, e in warm_ups(runs).items()} == {"device_only": 6}


def test_each_run_and_the_model_build_go_through_the_demos_reporter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not on a terminal (a pipe, CI) each run says it started, its requests answered so far
    and, when it is done, its figures; the models are built on the same reporter."""
    import io
    from types import SimpleNamespace

    from tierlink.core.progress import Reporter
    from tierlink.demo.phases import DemoSettings

    _answered_on_the_device(monkeypatch)
    items = [WorkItem(i, i, "dev-1", 150.0, Priority.INTERACTIVE, Privacy.SITE, 0.5 * i)
             for i in range(20)]
    stream = io.StringIO()
    reporter = Reporter(stream, clock=lambda: 0.0, interval_s=0.0, beat_s=None)
    demo_run._one_run(SimpleNamespace(config=load_fleet(EXAMPLE)), "device_only",
                      "device_only", items, SimpleNamespace(input=None, labels=None),
                      DemoSettings.quick(), None, None, None, reporter)
    lines = stream.getvalue().splitlines()
    assert lines[:3] == ["device_only: started",
                         "device_only: warming up (3 s of its traffic, not counted)",
                         "device_only: sending requests"]
    assert lines[3].startswith("device_only: 1/20 (5%) 0:00 elapsed")
    assert lines[12].startswith("device_only: 10/20 (50%) 0:00 elapsed, ~0:00 left; acc ")
    # the run's figures as soon as it ends
    assert lines[-1].startswith("device_only: done in 0:00; accuracy ")
    assert "SLA 100.0%" in lines[-1] and "device/edge/cloud 100% / 0% / 0%" in lines[-1]

    options = []

    def catalog(found):
        options.append(found)
        return SimpleNamespace(paths=lambda wanted: {})

    monkeypatch.setattr("tierlink.models.catalog.Catalog.default", catalog)
    demo_run._fleet_models("test", ["fmnist-small"], reporter)
    assert options[0].progress is reporter and options[0].say == reporter.say


def _answered_on_the_device(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, int, bool]]:
    """The demo's workload driver replaced: every request answered at its device at once;
    what each call sent (policy, requests, whether labels went along)."""
    sent: list[tuple[str | None, int, bool]] = []

    def drive(_fleet, items, _images, _labels, _task, policy, on_done, send_labels=True):
        sent.append((policy, len(items), send_labels))
        records = [Record(i, 0, True, False, "", 2.0, pred=0, tier="device",
                          served_by=i.origin, timings={"compute_ms": 0.2}) for i in items]
        for r in records:
            on_done(r)
        return records, PrivacyTally()

    monkeypatch.setattr("tierlink.demo.phases.run_workload", drive)
    monkeypatch.setattr(demo_run, "run_workload", drive)
    return sent

