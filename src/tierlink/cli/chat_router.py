"""``tierlink cascade chat-router``: train the chat difficulty router and choose its threshold
for a quality target or a budget of large-model calls."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from tierlink.cli.errors import fail
from tierlink.core.progress import Reporter
from tierlink.errors import TierlinkError

console = Console(stderr=True)


def chat_router_cmd(
    out: Path = typer.Option(..., help="where to write the router (JSON); a fleet's chat "
                                       "model names it as `router:`"),
    accuracy_drop: float | None = typer.Option(
        None, help="points below the large model the routed mix may be (default 1.0)"),
    large_budget: float | None = typer.Option(
        None, help="share of prompts the large model may answer (0-1), most accurate"),
    small: str = typer.Option("int8", help="the device's model: int8 (as devices serve it) "
                                           "or q3 (a 3-bit copy)"),
    n: int = typer.Option(1200, help="labelled prompts (half train, a quarter each for the "
                                     "threshold and the report)"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Train a difficulty router on labelled prompts built offline and tune its threshold."""
    from tierlink.cascade.tune import Target, TargetKind
    from tierlink.chat.router_train import answers, train_router

    if accuracy_drop is not None and large_budget is not None:
        raise typer.BadParameter("give --accuracy-drop or --large-budget, not both")
    if large_budget is not None and not 0.0 <= large_budget <= 1.0:
        raise typer.BadParameter("--large-budget is a share between 0 and 1")
    drop = 1.0 if accuracy_drop is None else accuracy_drop

    def target_for(top: float) -> Target:
        if large_budget is not None:
            return Target(TargetKind.ESCALATION_BUDGET, large_budget)
        return Target(TargetKind.ACCURACY_FLOOR, top - drop / 100)
    try:
        # the cache read or the models scoring: a heartbeat covers what reports nothing
        with Reporter(enabled=not as_json).phase("scoring labelled prompts") as phase:
            s = answers(small, n, progress=phase.stage)
            big = answers("fp32", n, progress=phase.stage)
        report = train_router(s, big, target_for)
    except TierlinkError as exc:
        fail(exc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**report.router.to_dict(), "report": report.figures}))
    f = report.figures
    if as_json:
        typer.echo(json.dumps(f, indent=2))
        return
    console.print(f"router -> {out}  ({f['target']})")
    console.print(f"held-out: small {100 * f['small_accuracy']:.2f}%, large "
                  f"{100 * f['large_accuracy']:.2f}%, routed {100 * f['accuracy']:.2f}% with "
                  f"{100 * f['large_share']:.1f}% large calls (random at that share "
                  f"{100 * f['random_same_share']:.2f}%)")
