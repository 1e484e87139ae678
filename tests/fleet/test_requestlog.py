"""A live run's request log: written as the demo records, read back in sending order,
refused with a clear message when it is not a request log."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlink.core.types import Priority, Privacy
from tierlink.errors import ConfigError
from tierlink.fleet.requestlog import (
    append_log,
    measured,
    read_log,
    read_runs,
    warm_up_run,
    warm_ups,
)
from tierlink.fleet.workload import Record, WorkItem


def _record(seq: int, at_s: float, served_by: str = "dev-1") -> Record:
    item = WorkItem(seq, 40 + seq, "dev-1", 150.0, Priority.INTERACTIVE, Privacy.SITE, at_s)
    return Record(item, 3, True, False, "", 2.5 + seq, pred=3, tier="device",
                  served_by=served_by, timings={"compute_ms": 0.2})


def test_runs_round_trip_in_sending_order(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    append_log(log, "tierlink", [_record(1, 0.04), _record(0, 0.0)])
    append_log(log, "device_only", [_record(0, 0.0)])
    runs = read_runs(log)
    assert list(runs) == ["tierlink", "device_only"]
    first = read_log(log)
    assert [e.item.seq for e in first] == [0, 1]
    e = first[1]
    assert e.item == _record(1, 0.04).item and e.latency_ms == 3.5
    assert e.served_by == "dev-1" and e.timings == {"compute_ms": 0.2} and e.answered
    assert len(read_log(log, "device_only")) == 1


def test_a_runs_warm_up_is_kept_apart_from_the_run(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    append_log(log, warm_up_run("tierlink"), [_record(0, 0.0)])  # as the demo writes it
    append_log(log, "tierlink", [_record(0, 0.0), _record(1, 0.04)])
    runs = read_runs(log)
    assert list(runs) == ["warm-up:tierlink", "tierlink"]
    assert list(measured(runs)) == ["tierlink"] and len(read_log(log)) == 2  # the run
    assert {name: len(e) for name, e in warm_ups(runs).items()} == {"tierlink": 1}


def test_the_simulator_refuses_warm_up_costs_from_a_log_without_any(tmp_path: Path) -> None:
    from tierlink.cli.sim import _measured_http

    log = tmp_path / "requests.jsonl"
    append_log(log, "tierlink", [_record(0, 0.0)])
    with pytest.raises(ConfigError, match="holds no warm-up") as caught:
        _measured_http(None, log, None, 784, warm_up=True)  # type: ignore[arg-type]
    assert "demo --log" in str(caught.value.hint)


def test_bad_logs_are_refused_with_what_is_wrong(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    append_log(log, "tierlink", [_record(0, 0.0)])
    with pytest.raises(ConfigError, match="no run 'bandit'") as caught:
        read_log(log, "bandit")
    assert "tierlink" in str(caught.value.hint)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="holds no request"):
        read_runs(tmp_path / "empty.jsonl")
    (tmp_path / "text.jsonl").write_text("hello\n")
    with pytest.raises(ConfigError, match=r"text.jsonl:1 is not a JSON line"):
        read_runs(tmp_path / "text.jsonl")
    (tmp_path / "other.jsonl").write_text('{"run": "x", "seq": 1}\n')
    with pytest.raises(ConfigError, match="not a request log line"):
        read_runs(tmp_path / "other.jsonl")
    with pytest.raises(ConfigError, match="cannot read the request log"):
        read_runs(tmp_path / "missing.jsonl")
