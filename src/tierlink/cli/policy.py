"""``tierlink policy evaluate|promote``: a candidate policy judged from the shadow logs
its nodes wrote (``routing.shadow``), and made the fleet's acting policy only when its
estimated reward's lower bound beats the acting policy's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.errors import ConfigError

policy_app = typer.Typer(help="Evaluate a shadow candidate off-policy; promote it.",
                         no_args_is_help=True)
console = Console()


def evaluate_logs(logs: list[Path]) -> dict[str, Any]:
    from tierlink.policy.ope import doubly_robust, ips, on_policy, read_log

    decisions, candidates = [], []
    for path in logs:
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read shadow log {path}: {exc}") from None
        got, named = read_log(lines)
        decisions += got
        candidates += [c for c in named if c not in candidates]
    if not decisions:
        raise ConfigError("the shadow logs hold no decision",
                          hint="set routing.shadow in the fleet file and let traffic flow")
    if len(candidates) != 1:
        raise ConfigError(f"the logs name {len(candidates)} candidate policies: evaluate the "
                          "logs of one candidate at a time", hint=json.dumps(candidates))
    dr, by_ips, acting = doubly_robust(decisions), ips(decisions), on_policy(decisions)
    return {"decisions": len(decisions), "candidate_policy": candidates[0],
            "candidate": dr.to_dict(), "candidate_ips": by_ips.to_dict(),
            "acting": acting.to_dict(),
            "agreement": round(sum(e.acting == e.candidate for e in decisions)
                               / len(decisions), 4)}


@policy_app.command("evaluate")
def evaluate(logs: list[Path] = typer.Argument(..., help="shadow.jsonl files"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Estimate the shadow candidate's reward per request (doubly robust and IPS, 95%)."""
    from tierlink.cli.errors import fail
    from tierlink.errors import TierlinkError

    try:
        report = evaluate_logs(logs)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    table = Table("", "reward per request", "95% interval",
                  title=f"{report['decisions']} decisions, candidate "
                        f"{report['candidate_policy']}")
    for label, key in (("candidate (doubly robust)", "candidate"),
                       ("candidate (IPS)", "candidate_ips"), ("acting (logged)", "acting")):
        e = report[key]
        table.add_row(label, f"{e['estimate']:+.4f}", f"[{e['ci_low']:+.4f}, {e['ci_high']:+.4f}]")
    console.print(table)
    console.print(f"the candidate chose as the acting policy did on "
                  f"{100 * report['agreement']:.1f}% of the decisions")


@policy_app.command("promote")
def promote_cmd(fleet_file: Path = typer.Argument(..., help="the fleet YAML to switch"),
                logs: list[Path] = typer.Argument(..., help="shadow.jsonl files"),
                dry_run: bool = typer.Option(False, "--dry-run")) -> None:
    """Make the candidate the fleet's policy — only if its lower bound beats the acting
    policy's mean reward; otherwise say why and change nothing (exit 1)."""
    from tierlink.cli.errors import fail
    from tierlink.errors import TierlinkError
    from tierlink.fleet.fleetfile import promote_policy
    from tierlink.policy.ope import Estimate, promote

    try:
        report = evaluate_logs(logs)
        c, a = report["candidate"], report["acting"]
        ok = promote(Estimate(c["estimate"], c["ci_low"], c["ci_high"], c["n"]),
                     Estimate(a["estimate"], a["ci_low"], a["ci_high"], a["n"]))
        verdict = (f"candidate {c['estimate']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]"
                   f" vs acting {a['estimate']:+.4f} over {report['decisions']} decisions")
        if not ok:
            console.print(f"not promoted: the candidate's lower bound does not beat the acting "
                          f"policy ({verdict})")
            raise typer.Exit(1)
        cand = report["candidate_policy"]
        if not dry_run:
            promote_policy(fleet_file, cand["policy"], cand.get("weights"),
                           f"promoted from shadow mode: {verdict}")
        console.print(f"{'would promote' if dry_run else 'promoted'} {cand}: {verdict}")
    except TierlinkError as exc:
        fail(exc)
