"""A live run's request log: one JSON line per request a workload sent — what was asked
(when, from which device, which input, deadline, priority, privacy) and what came back
(latency seen by the application, who answered at which tier, the answer's timings).

``tierlink demo --log PATH`` writes it; ``tierlink sim --replay PATH`` sends the same
requests at the same times through a simulated fleet, and the simulator's HTTP costs can be
measured from it (``sim/http.py``). Lines of several runs share one file, each tagged with
its run's name; a run's warm-up (requests sent right before it, not counted) is tagged
``warm-up:<run>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierlink.core.types import Priority, Privacy
from tierlink.errors import ConfigError
from tierlink.fleet.workload import Record, WorkItem

__all__ = [
    "LoggedRequest",
    "append_log",
    "measured",
    "read_log",
    "read_runs",
    "warm_up_run",
    "warm_ups",
]

WARM_UP = "warm-up:"  # the tag of a run's warm-up: warm-up:<run>


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    run: str
    item: WorkItem
    answered: bool
    latency_ms: float
    tier: str
    served_by: str
    timings: dict[str, float]


def append_log(path: Path, run: str, records: Iterable[Record]) -> None:
    """Add ``records`` of ``run`` to the log at ``path`` (made if missing)."""
    with path.open("a") as out:
        for r in records:
            i = r.item
            out.write(json.dumps({
                "run": run, "seq": i.seq, "at_s": round(i.at_s, 6), "origin": i.origin,
                "sample": i.sample, "deadline_ms": i.deadline_ms,
                "priority": i.priority.label, "privacy": i.privacy.value,
                "answered": r.answered, "latency_ms": round(r.latency_ms, 3), "tier": r.tier,
                "served_by": r.served_by, "timings": dict(r.timings)}) + "\n")


def warm_up_run(run: str) -> str:
    """The name ``run``'s warm-up is logged under."""
    return f"{WARM_UP}{run}"


def measured(runs: dict[str, list[LoggedRequest]]) -> dict[str, list[LoggedRequest]]:
    """The runs that were measured (warm-ups left out)."""
    return {name: e for name, e in runs.items() if not name.startswith(WARM_UP)}


def warm_ups(runs: dict[str, list[LoggedRequest]]) -> dict[str, list[LoggedRequest]]:
    """Each run's warm-up, by the run's name."""
    return {name.removeprefix(WARM_UP): e for name, e in runs.items()
            if name.startswith(WARM_UP)}


def read_log(path: Path, run: str | None = None) -> list[LoggedRequest]:
    """The requests of ``run`` (default: the log's first measured run), in sending order."""
    runs = read_runs(path)
    chosen = run or next(iter(measured(runs) or runs))
    if chosen not in runs:
        raise ConfigError(f"the request log {path} has no run {chosen!r}",
                          hint=f"runs in it: {', '.join(runs)}")
    return runs[chosen]


def read_runs(path: Path) -> dict[str, list[LoggedRequest]]:
    """Every run in the log (in the order they were written), its requests in sending order."""
    runs: dict[str, list[LoggedRequest]] = {}
    for n, row in _rows(path):
        entry = _parse(row, f"{path}:{n}")
        runs.setdefault(entry.run, []).append(entry)
    if not runs:
        raise ConfigError(f"the request log {path} holds no request")
    return {name: sorted(entries, key=lambda e: (e.item.at_s, e.item.seq))
            for name, entries in runs.items()}


def _rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the request log {path}: {exc.strerror}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{n} is not a JSON line",
                              hint="a request log is what `tierlink demo --log` writes"
                              ) from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{n} is not a JSON object")
        rows.append((n, row))
    return rows


def _parse(row: dict[str, Any], where: str) -> LoggedRequest:
    try:
        item = WorkItem(int(row["seq"]), int(row["sample"]), str(row["origin"]),
                        float(row["deadline_ms"]), Priority.parse(str(row["priority"])),
                        Privacy(str(row["privacy"])), float(row["at_s"]))
        timings = {str(k): float(v) for k, v in (row.get("timings") or {}).items()}
        return LoggedRequest(str(row["run"]), item, bool(row.get("answered", False)),
                             float(row.get("latency_ms", 0.0)), str(row.get("tier", "")),
                             str(row.get("served_by", "")), timings)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{where}: not a request log line ({exc})",
                          hint="a request log is what `tierlink demo --log` writes") from None
