"""``tierlink policy``: the fleet's routing policy, judged and changed while it serves.

``evaluate LOGS``: a shadow candidate (``routing.shadow``) judged off-policy from the logs
its nodes wrote. ``promote FLEET LOGS``: made the fleet's acting policy — in the file and on
the running fleet — only when its estimated reward's lower bound beats the acting policy's
own. ``apply FLEET``: the file's routing section as the running fleet's next revision;
``revert``: back to the previous revision; ``history``: the revisions. Nodes take a new
revision with their next heartbeat (``control/routing_revisions.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.operator import AdminToken, ControlUrl, call
from tierlink.errors import ConfigError

policy_app = typer.Typer(help="Judge a shadow candidate off-policy; change the running "
                              "fleet's policy (apply, promote, revert, history).",
                         no_args_is_help=True)
AsJson = typer.Option(False, "--json", help="print the revision(s) as JSON")
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
                dry_run: bool = typer.Option(False, "--dry-run"),
                live: bool = typer.Option(True, "--live/--file-only",
                                          help="also apply it to the running fleet"),
                control: str = ControlUrl, admin_token: str | None = AdminToken) -> None:
    """Make the candidate the fleet's policy — only if its lower bound beats the acting
    policy's mean reward; otherwise say why and change nothing (exit 1). The file is
    rewritten, and the running fleet takes it as a new revision (``--file-only``: not)."""
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
        if dry_run:
            console.print(f"would promote {cand}: {verdict}")
            return
        promote_policy(fleet_file, cand["policy"], cand.get("weights"),
                       f"promoted from shadow mode: {verdict}")
        console.print(f"promoted {cand} in {fleet_file}: {verdict}")
        if live:
            made = apply_fleet(fleet_file, control, admin_token, "promote")
            console.print(_said(made))
    except TierlinkError as exc:
        fail(exc)


def apply_fleet(fleet_file: Path, control: str, token: str | None, note: str
                ) -> dict[str, Any]:
    """The file's routing section as the running fleet's next revision."""
    from tierlink.fleet.config import load_fleet

    routing = load_fleet(fleet_file).routing.to_dict()
    return dict(call(control, token, "PUT", "/v1/routing", {"routing": routing,
                                                           "note": note}))


@policy_app.command("apply")
def apply_cmd(fleet_file: Path = typer.Argument(..., help="the fleet YAML whose routing "
                                                           "section to apply"),
              note: str = typer.Option("apply", help="why (kept with the revision)"),
              control: str = ControlUrl, admin_token: str | None = AdminToken,
              as_json: bool = AsJson) -> None:
    """Apply the file's routing section (policy and options, weights, thresholds, shadow)
    to the running fleet as its next revision; every node swaps at its next heartbeat."""
    from tierlink.cli.errors import fail
    from tierlink.errors import TierlinkError

    try:
        made = apply_fleet(fleet_file, control, admin_token, note)
    except TierlinkError as exc:
        fail(exc)
    _show(made, as_json)


@policy_app.command("revert")
def revert_cmd(note: str = typer.Option("", help="why (kept with the revision)"),
               control: str = ControlUrl, admin_token: str | None = AdminToken,
               as_json: bool = AsJson) -> None:
    """Go back to the previous revision's routing (as a new revision)."""
    from tierlink.cli.errors import fail
    from tierlink.errors import TierlinkError

    try:
        made = call(control, admin_token, "POST", "/v1/routing/revert", {"note": note})
    except TierlinkError as exc:
        fail(exc)
    _show(made, as_json)


@policy_app.command("history")
def history_cmd(control: str = ControlUrl, admin_token: str | None = AdminToken,
                as_json: bool = AsJson) -> None:
    """The fleet's routing revisions, newest first."""
    import time

    from tierlink.cli.errors import fail
    from tierlink.errors import TierlinkError

    try:
        answer = call(control, admin_token, "GET", "/v1/routing")
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    table = Table("revision", "stored", "policy", "note", title=f"routing at {control}")
    for rev in answer["history"]:
        stored = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rev["at"]))
        table.add_row(str(rev["revision"]), stored, _policy_of(rev["routing"]), rev["note"])
    console.print(table)


def _show(made: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(made, indent=2))
    else:
        console.print(_said(made))


def _policy_of(routing: dict[str, Any]) -> str:
    policy = routing.get("policy", "tierlink")
    return policy if isinstance(policy, str) else json.dumps(policy)


def _said(made: dict[str, Any]) -> str:
    return (f"routing revision {made['revision']} ({made['note']}): policy "
            f"{_policy_of(made['routing'])}; nodes take it with their next heartbeat")
