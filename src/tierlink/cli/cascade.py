"""``tierlink cascade``: tune a fleet's cascade thresholds for a stated target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.core.progress import Reporter, as_reporter
from tierlink.errors import ConfigError, TierlinkError

app = typer.Typer(help="Tune where cascades stop.", no_args_is_help=True)
console = Console(stderr=True)


@app.command("tune")
def tune_cmd(
    fleet_file: Path = typer.Argument(..., help="the fleet YAML whose thresholds to set"),
    task: str = typer.Option("fmnist", help="the task whose cascade to tune"),
    accuracy_drop: float | None = typer.Option(
        None, help="accuracy floor = the most accurate stage alone minus this many points "
                   "(default: the fleet file's routing.cascade.target, else 0.3)"),
    accuracy_floor: float | None = typer.Option(None, help="accuracy floor in percent"),
    max_escalation: float | None = typer.Option(
        None, help="escalate at most this share (0..1) past the device, most accurate"),
    cost_share: float | None = typer.Option(
        None, help="cost at most this fraction of the top stage alone, most accurate"),
    prefer: str = typer.Option(
        "device", help="for accuracy floors: 'device' (fewest escalations, then cost) or "
                       "'cost' (cheapest outright)"),
    confidence: float = typer.Option(
        0.95, help="accuracy targets: hold on unseen data with this probability (a "
                   "finite-sample test over the calibration records); 0 = just meet the "
                   "target on the calibration split"),
    batch: int = typer.Option(
        0, help="make the guarantee about any batch of this many requests rather than "
                "the expected accuracy (stricter: more escalations)"),
    write: bool = typer.Option(True, help="write the thresholds into FLEET_FILE"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Choose per-tier confidence thresholds on the calibration split, check them on the
    test split, and write them into the fleet file: routing.thresholds (the comment states
    the target, its confidence and the bound reached) and routing.cascade (the models'
    sha256 the thresholds belong to, and the calibration records policies price with)."""
    try:
        if all(v is None for v in (accuracy_drop, accuracy_floor, max_escalation, cost_share)):
            accuracy_drop = _file_drop(fleet_file)  # re-tune for what the file was tuned for
        goal = _goal(accuracy_drop, accuracy_floor, max_escalation, cost_share, prefer,
                     confidence, batch)
        report = tune_fleet(fleet_file, task, goal, progress=not as_json)
        if write:
            write_report(fleet_file, report)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(report.to_dict() | {"written": write}, indent=2))
    else:
        _print(report, fleet_file if write else None)
    if not report.feasible:
        raise typer.Exit(1)


def _file_drop(fleet_file: Path) -> float | None:
    from tierlink.fleet.config import load_fleet

    return load_fleet(fleet_file).routing.cascade_target.get("accuracy_drop")


def write_report(fleet_file: Path, report: Any) -> None:
    """The tuned thresholds, their provenance and records, into ``fleet_file``."""
    from tierlink.cascade.records import record_to_dict
    from tierlink.fleet.fleetfile import write_cascade
    from tierlink.fleet.tuning import target_of

    write_cascade(fleet_file, report.thresholds(), report.tuned_on or {},
                  {k: record_to_dict(r) for k, r in (report.records or {}).items()},
                  comment=f"cascade tune: {report.describe()}", target=target_of(report.goal))


def _goal(drop: float | None, floor: float | None, escalation: float | None,
          share: float | None, prefer: str = "device", confidence: float = 0.0,
          batch: int = 0) -> Any:
    from tierlink.cascade.report import Goal

    given = {k: v for k, v in (("accuracy_drop", drop), ("accuracy_floor", floor),
                                ("escalation_budget", escalation), ("cost_share", share))
             if v is not None}
    if len(given) > 1:
        raise ConfigError(f"give one target, got {sorted(given)}")
    kind, value = next(iter(given.items()), ("accuracy_drop", 0.3))
    if kind == "accuracy_floor":
        value /= 100.0
    if kind in ("escalation_budget", "cost_share") and not 0.0 <= value <= 1.0:
        raise ConfigError(f"--{kind.replace('_', '-')} is a share in 0..1, got {value}")
    if prefer not in ("device", "cost"):
        raise ConfigError(f"--prefer is 'device' or 'cost', got {prefer!r}")
    if not 0.0 <= confidence < 1.0:
        raise ConfigError(f"--confidence is a probability in [0, 1), got {confidence}",
                          hint="e.g. 0.95; 0 tunes on the calibration split's point estimate")
    if batch < 0:
        raise ConfigError(f"--batch is a number of requests, got {batch}")
    return Goal(kind, value, prefer, confidence or None, batch or None)


def tune_fleet(fleet_file: Path, task: str, goal: Any,
               progress: bool | Reporter = True) -> Any:
    """Load the fleet and its zoo, build the task's chain, tune it; models built and the
    tuning shown on ``progress`` (a reporter; ``True``: stderr)."""
    from tierlink.cascade.report import tune_chain
    from tierlink.cascade.stages import chain_from_fleet
    from tierlink.fleet.config import load_fleet
    from tierlink.models.catalog import Catalog, SourceOptions

    reporter = as_reporter(progress)
    config = load_fleet(fleet_file)
    if _imported(config, task):
        with reporter.phase("tuning thresholds"):
            return _tune_imported(config, task, goal)
    chain = chain_from_fleet([(n.tier, n.models) for n in config.nodes], task)
    catalog = Catalog.default(SourceOptions(profile=config.zoo_profile, progress=reporter,
                                            say=reporter.say))
    found = catalog.resolve(chain.models)  # e.g. fmnist-small-fp16, made on first use
    with reporter.phase("tuning thresholds"):  # blocking: its heartbeat speaks for it
        return tune_chain(found, chain, catalog.data(task), goal,
                          config.routing.policy_config().cost)


def _imported(config: Any, task: str) -> bool:
    """Whether ``task``'s models come from the model store (users' own models)."""
    from tierlink.zoo.profiles import TASKS

    return task not in TASKS or task in config.tasks


def _tune_imported(config: Any, task: str, goal: Any) -> Any:
    """The chain of imported models (each model's task from its card), tuned on the data
    they were imported with: calibration part to tune, evaluation part to report."""
    from dataclasses import replace

    from tierlink.cascade.report import tune_stages
    from tierlink.cascade.stages import chain_from_fleet
    from tierlink.modelstore.stages import imported_stages
    from tierlink.modelstore.store import ModelStore

    store = ModelStore.default()

    def task_of(name: str) -> str | None:
        return store.card(name).task if store.has(name) else None

    from tierlink.zoo.photo_models import PHOTO_TASK
    from tierlink.zoo.profiles import TASKS

    missing = [m for n in config.nodes for m in n.models if not store.has(m)
               and not any(m.startswith(f"{t}-") for t in (*TASKS, PHOTO_TASK))]
    if missing:
        raise ConfigError(f"the fleet names models the model store does not have: {missing}",
                          hint="import them first with `tierlink model import`")
    chain = chain_from_fleet([(n.tier, n.models) for n in config.nodes], task, task_of)
    stages = imported_stages(store, chain, config.routing.policy_config().cost)
    report = tune_stages(stages.calib, stages.eval, chain, goal)
    return replace(report, tuned_on=stages.tuned_on)


def _print(report: Any, written: Path | None) -> None:
    table = Table(title=f"cascade {' -> '.join(report.chain.models)}: "
                        f"{report.describe()}")
    for col in ("split", "thresholds", "accuracy", "cost / 1k req", "answered per stage"):
        table.add_column(col)
    top = report.chain.models[-1]
    for split in ("calib", "test"):
        op = getattr(report, split)
        alone = report.alone[split][top]
        table.add_row(split, ", ".join(f"{t:.4f}" for t in op.thresholds),
                      f"{100 * op.accuracy:.2f}%", f"${1000 * op.cost:.6f}",
                      " / ".join(f"{100 * s:.1f}%" for s in op.shares))
        table.add_row(f"{split}: {top} alone", "", f"{100 * alone.accuracy:.2f}%",
                      f"${1000 * alone.cost:.6f}", "")
    Console().print(table)
    verdict = "met" if report.feasible else "[red]NOT met[/red] (closest setting shown)"
    console.print(f"target {verdict} on the calibration split")
    if written:
        console.print(f"wrote routing.thresholds {report.thresholds()} into {written}")
