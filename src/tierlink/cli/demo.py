"""The demo's terminal side: progress while it runs, the side-by-side table at the end."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tierlink.fleet.config import load_fleet
from tierlink.fleet.demo import (
    RUNS,
    DemoSettings,
    environment,
    fleet_summary,
    hard_example_summary,
    run_workload,
    workload_for,
)
from tierlink.fleet.launcher import launch

console = Console(stderr=True)


def run_demo(fleet_file: Path, *, quick: bool, json_path: Path | None,
             requests: int | None = None, rate: float | None = None) -> dict[str, Any]:
    from tierlink.cli.main import zoo_models
    from tierlink.zoo.datasets import fashion_mnist

    settings = DemoSettings.quick() if quick else DemoSettings()
    settings = DemoSettings(requests or settings.requests, rate or settings.rate_per_s,
                            settings.seed, settings.task)
    config = load_fleet(fleet_file)
    models, zoo_summary = zoo_models(config.zoo_profile, config.model_names())
    test = fashion_mnist().test
    items = workload_for(config, settings, len(test.labels))
    run_dir = Path(tempfile.mkdtemp(prefix="tierlink-demo-"))
    with launch(config, models, run_dir, say=lambda m: console.print(f"[dim]{m}[/dim]")) as fleet:
        runs = {name: _one_run(fleet, name, policy, items, test, settings) for name, policy in RUNS}
        report = {"runs": runs, "fleet": fleet_summary(fleet),
                  "thresholds": dict(config.routing.thresholds),
                  "hard_examples": hard_example_summary(fleet.control_url),
                  "environment": environment(fleet, settings, zoo_summary)}
    _print_report(report)
    if json_path:
        json_path.write_text(json.dumps(report, indent=2))
        console.print(f"report written to {json_path}")
    return report


def _one_run(fleet: Any, name: str, policy: str | None, items: list, test: Any,
             settings: DemoSettings) -> dict[str, Any]:
    from tierlink.fleet.workload import summarize

    columns = (TextColumn(f"[bold]{name:<12}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[live]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(name, total=len(items), live="")
        done: list[Any] = []

        def on_done(record: Any) -> None:
            done.append(record)
            if len(done) % 10 == 0 or len(done) == len(items):
                s: dict[str, Any] = summarize(done, 0)
                progress.update(task, completed=len(done), live=(
                    f"acc {100 * s['accuracy']:.1f}%  p95 {s['p95_ms']:.0f} ms  "
                    f"SLA {100 * s['sla_attainment']:.0f}%  lost {s['lost']}"))

        records, violations = run_workload(fleet, items, test.images, test.labels,
                                           settings.task, policy, on_done)
    return summarize(records, violations)


def _print_report(report: dict[str, Any]) -> None:
    runs = report["runs"]
    table = Table(title="same workload, three ways (Fashion-MNIST test split)")
    table.add_column("")
    for name in runs:
        table.add_column(name, justify="right")
    rows = [("requests", "requests", "{:d}"), ("answered", "answered", "{:d}"),
            ("refused", "refused", "{:d}"), ("lost", "lost", "{:d}"),
            ("accuracy", "accuracy", "{:.2%}"), ("p50 ms", "p50_ms", "{:.1f}"),
            ("p95 ms", "p95_ms", "{:.1f}"), ("p99 ms", "p99_ms", "{:.1f}"),
            ("SLA attainment", "sla_attainment", "{:.1%}"),
            ("cost per 1k (USD)", "cost_per_1k", "{:.6f}"),
            ("privacy violations", "privacy_violations", "{:d}")]
    for label, key, fmt in rows:
        table.add_row(label, *(fmt.format(r[key]) for r in runs.values()))
    table.add_row("served on device/edge/cloud", *(
        "/".join(f"{100 * r['tier_share'][t]:.0f}%" for t in ("device", "edge", "cloud"))
        for r in runs.values()))
    Console().print(table)
    env = report["environment"]
    hard = report["hard_examples"]
    wrong = hard["wrong_share_of_labelled"]
    console.print(f"cascade thresholds {report['thresholds']}; hard examples kept by the "
                  f"control plane: {hard['stored']} {hard['by_privacy']}"
                  + (f", {100 * wrong:.0f}% of them misclassified where labelled"
                     if wrong is not None else ""))
    console.print(f"device CPU throttle: {env['device_cpu_throttle']}; "
                  f"{env['requests_per_run']} requests per run at {env['rate_per_s']}/s")
