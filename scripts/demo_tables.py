"""Print the README's demo tables (Markdown) from one or more `tierlink demo --json` reports.

    .venv/bin/python scripts/demo_tables.py docs/results/demo-quick.json [more runs ...]

With several reports (runs of the same demo), a cell whose figure differs between runs
shows every run's, separated by "; ", so the tables say how much a figure moves.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RUNS = ("tierlink", "static_rules", "cloud_only", "device_only")


def cell(reports: list[dict[str, Any]], run: str, get: Callable[[dict[str, Any]], str]) -> str:
    values = []
    for report in reports:
        r = report["runs"].get(run)
        values.append("–" if r is None else get(r))
    return values[0] if len(set(values)) == 1 else "; ".join(values)


def table(reports: list[dict[str, Any]], rows: list[tuple[str, Callable[..., str]]],
          runs: tuple[str, ...] = RUNS) -> str:
    out = ["| | " + " | ".join(runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for label, get in rows:
        out.append(f"| {label} | " + " | ".join(cell(reports, r, get) for r in runs) + " |")
    return "\n".join(out)


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def main_rows() -> list[tuple[str, Callable[..., str]]]:
    return [
        ("accuracy", lambda r: pct(r["accuracy"])),
        ("p50 / p95 ms", lambda r: f"{r['p50_ms']:.1f} / {r['p95_ms']:.1f}"),
        ("SLA attainment", lambda r: f"{100 * r['sla_attainment']:.1f}%"),
        ("cost per 1k requests (USD)", lambda r: f"{r['cost_per_1k']:.6f}"),
        ("served on device / edge / cloud", lambda r: " / ".join(
            f"{100 * r['tier_share'][t]:.0f}%" for t in ("device", "edge", "cloud"))),
        ("refused / lost / privacy violations",
         lambda r: f"{r['refused']} / {r['lost']} / {r['privacy_violations']}"),
    ]


def breakdown_rows(first: dict[str, Any]) -> list[tuple[str, Callable[..., str]]]:
    def group(section: str, key: str) -> Callable[..., str]:
        return lambda r: (f"{100 * r[section][key]['accuracy']:.1f}% / "
                          f"{100 * r[section][key]['sla_attainment']:.0f}%")

    rows = [(f"`{k}` ({first['by_privacy'][k]['requests']})", group("by_privacy", k))
            for k in first["by_privacy"]]
    rows += [(f"{k}, {first['by_sla'][k]['deadline_ms']:.0f} ms", group("by_sla", k))
             for k in first["by_sla"]]
    rows += [(f"`any`, {k.replace('_', ' ')} ({first['any_by_cloud_room'][k]['requests']})",
              group("any_by_cloud_room", k)) for k in first["any_by_cloud_room"]]
    return rows


def photo_rows() -> list[tuple[str, Callable[..., str]]]:
    def im(get: Callable[[dict[str, Any]], str]) -> Callable[..., str]:
        return lambda r: get(r["imagenet"]) if "imagenet" in r else "–"

    return [
        ("split / remote (answered of 40)", im(lambda p: (
            f"{p['served']['split']} / {p['served']['remote']} ({p['answered']})"))),
        ("p50 / p95 ms", im(lambda p: "–" if p["p50_ms"] is None
                            else f"{p['p50_ms']:.0f} / {p['p95_ms']:.0f}")),
        ("SLA attainment / refused", im(lambda p: (
            f"{100 * p['sla_attainment']:.0f}% / {p['refused']}"))),
        ("top-1 agreement", im(lambda p: "–" if p["agreement_top1"] is None
                               else f"{100 * p['agreement_top1']:.0f}%")),
        ("privacy violations", im(lambda p: str(p["privacy_violations"]))),
    ]


def main(paths: list[str]) -> None:
    reports = [json.loads(Path(p).read_text()) for p in paths]
    first = reports[0]["runs"]["tierlink"]
    print(table(reports, main_rows()), end="\n\n")
    print("accuracy / SLA attainment by privacy level, SLA class and, for `any`, whether "
          "the deadline leaves room for the cloud:\n")
    print(table(reports, breakdown_rows(first)), end="\n\n")
    esc = [r["runs"]["tierlink"]["escalation"] for r in reports]
    print("escalated (left the device) of the requests that may: "
          + "; ".join(f"{100 * e['escalated_share']:.1f}%" for e in esc)
          + " — predicted on these inputs "
          + "; ".join(f"{100 * e['escalated_share_expected']:.1f}%" for e in esc)
          + ", on the calibration split "
          + "; ".join(f"{100 * e['escalated_share_tuned']:.1f}%" for e in esc), end="\n\n")
    print(table(reports, photo_rows(), ("tierlink", "static_rules", "cloud_only")))


if __name__ == "__main__":
    main(sys.argv[1:])
