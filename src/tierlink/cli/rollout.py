"""``tierlink rollout``: staged rollouts of a model version (operators).

``start MODEL VERSION --tier edge --canary 10% --soak 60s``: move a share of the tier's
traffic to the version, watch the health gates, promote stage by stage or roll back by
itself (see :mod:`tierlink.rollout`). ``status [ID]``: the rollouts, or one in detail (its
assignments, gate verdicts and every transition with its reason). ``promote``,
``rollback``, ``pause``, ``resume``: operator actions, each logged with ``--reason``.

An ``ID`` is a rollout id or a model name (its latest rollout). Shares take ``10%`` or
``0.1``; durations ``60s``, ``2m``, ``1h``, ``500ms`` or plain seconds (``90``).

The lead registers ``app`` as ``tierlink rollout``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.cli.operator import AdminToken, ControlUrl, call
from tierlink.errors import ConfigError, RolloutError, TierlinkError

app = typer.Typer(help="Staged rollouts of a model version with health gates (operators).",
                  no_args_is_help=True)
console = Console(stderr=True)
AsJson = typer.Option(False, "--json", help="print the record(s) as JSON")
Reason = typer.Option(None, "--reason", help="why (goes into the rollout's log)")
RolloutId = typer.Argument(..., help="a rollout id, or a model name for its latest rollout")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


# -- parsing ------------------------------------------------------------------------------


def parse_share(text: str, what: str = "share") -> float:
    """``"10%"`` or ``"0.1"`` -> 0.1; ``ConfigError`` outside (0, 1]."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{what} must be a share in (0, 1], got {text!r}",
                          hint="write 10% or 0.1")
    return value


def parse_stages(text: str) -> list[float]:
    """``"10%,50%,100%"`` or ``"0.1,0.5,1"`` -> ``[0.1, 0.5, 1.0]`` (order is checked by the
    control plane)."""
    return [parse_share(part, "every stage") for part in text.split(",") if part.strip()]


def parse_duration(text: str, what: str = "duration") -> float:
    """``"60s"``, ``"2m"``, ``"1h"``, ``"500ms"`` or ``"90"`` -> seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(f"{what} must be a duration, got {text!r}",
                          hint="write 60s, 2m, 1h, 500ms or plain seconds")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


# -- HTTP ---------------------------------------------------------------------------------


def _resolve(url: str, token: str | None, key: str) -> int:
    """A rollout id from ``key``: an id as is, a model name as its latest rollout's id."""
    if key.isascii() and key.isdigit():
        return int(key)
    found = call(url, token, "GET", "/v1/rollouts", params={"model": key})["rollouts"]
    if not found:
        raise RolloutError(f"no rollout of model {key!r} (and it is not a rollout id)",
                           hint="list them with `tierlink rollout status`")
    return int(found[0]["id"])


# -- commands -----------------------------------------------------------------------------


@app.command("start")
def start_cmd(
    model: str = typer.Argument(..., help="the model name, as `tierlink model list` shows it"),
    version: str = typer.Argument(..., help="the published version to roll out"),
    tier: str = typer.Option(..., "--tier", help="device, edge or cloud"),
    canary: str | None = typer.Option(None, "--canary", help="the first stage's share of "
                                      "the tier's traffic, e.g. 10% (then 50%, then all)"),
    stages: str | None = typer.Option(None, "--stages", help="every stage instead, e.g. "
                                      "0.1,0.5,1 (increasing, ending at 1)"),
    soak: str | None = typer.Option(None, "--soak", help="how long each stage runs before "
                                    "it may pass, e.g. 60s (default 60s)"),
    min_requests: int | None = typer.Option(None, "--min-requests", min=1, help="requests "
                                            "needed on each side of a comparison (default "
                                            "100)"),
    previous: str | None = typer.Option(None, "--previous", help="the version to compare "
                                        "with and roll back to (default: the one most of "
                                        "the tier's nodes serve)"),
    deploy_timeout: str | None = typer.Option(None, "--deploy-timeout", help="how long "
                                              "nodes may take to load a stage (default 2m)"),
    max_soak: str | None = typer.Option(None, "--max-soak", help="longest soak waiting for "
                                        "data (default 3 x --soak)"),
    on_insufficient: str | None = typer.Option(None, "--on-insufficient-data",
                                               help="hold (default), promote or rollback"),
    cohort: list[str] | None = typer.Option(None, "--cohort", help="the nodes with these "
                                            "labels, e.g. hw=jetson or site=a,hw=x; repeat "
                                            "it: one cohort after another, each with its "
                                            "own stages and gates (default: the whole tier)"),
    control: str = ControlUrl, admin_token: str | None = AdminToken, as_json: bool = AsJson,
) -> None:
    """Start a staged rollout of MODEL VERSION on a tier (cohort by cohort with --cohort)."""
    try:
        body = _start_body(model, version, tier, canary, stages, soak, min_requests, previous,
                           deploy_timeout, max_soak, on_insufficient)
        if cohort:
            body["cohorts"] = [parse_labels(c) for c in cohort]
        record = call(control, admin_token, "POST", "/v1/rollouts", body)
    except TierlinkError as exc:
        fail(exc)
    _show_record(record, as_json, f"started rollout {record['id']}")


def parse_labels(text: str) -> dict[str, str]:
    """``hw=jetson,site=a`` as labels; ``ConfigError`` naming the bad part."""
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"--cohort {text!r}: {part!r} is not label=value",
                              hint="e.g. --cohort hw=jetson --cohort hw=pi")
        out[key.strip()] = value.strip()
    if not out:
        raise ConfigError(f"--cohort {text!r} names no label", hint="e.g. --cohort hw=jetson")
    return out


def _start_body(model: str, version: str, tier: str, canary: str | None, stages: str | None,
                soak: str | None, min_requests: int | None, previous: str | None,
                deploy_timeout: str | None, max_soak: str | None,
                on_insufficient: str | None) -> dict[str, Any]:
    if canary is not None and stages is not None:
        raise ConfigError("give --canary or --stages, not both",
                          hint="--canary 10% means --stages 10%,50%,100%")
    body: dict[str, Any] = {
        "name": model, "version": version, "tier": tier, "previous": previous,
        "min_requests": min_requests, "insufficient_data": on_insufficient,
        "canary": None if canary is None else parse_share(canary, "--canary"),
        "stages": None if stages is None else parse_stages(stages),
        "soak_s": None if soak is None else parse_duration(soak, "--soak"),
        "deploy_timeout_s": (None if deploy_timeout is None
                             else parse_duration(deploy_timeout, "--deploy-timeout")),
        "max_soak_s": None if max_soak is None else parse_duration(max_soak, "--max-soak"),
    }
    return {k: v for k, v in body.items() if v is not None}


@app.command("status")
def status_cmd(rollout: str | None = typer.Argument(None, help="a rollout id or model name "
                                                    "(default: every rollout)"),
               control: str = ControlUrl, admin_token: str | None = AdminToken,
               as_json: bool = AsJson) -> None:
    """The rollouts (newest first), or one in detail."""
    try:
        if rollout is None:
            answer = call(control, admin_token, "GET", "/v1/rollouts")
        else:
            rollout_id = _resolve(control, admin_token, rollout)
            record = call(control, admin_token, "GET", f"/v1/rollouts/{rollout_id}")
    except TierlinkError as exc:
        fail(exc)
    if rollout is None:
        if as_json:
            print(json.dumps(answer["rollouts"], indent=2))
        elif not answer["rollouts"]:
            console.print(f"no rollouts at {control}; start one with `tierlink rollout start`")
        else:
            Console().print(_list_table(control, answer["rollouts"], answer.get("now")))
        return
    if as_json:
        print(json.dumps(record, indent=2))
        return
    _print_details(record)


def _action(name: str, rollout: str, reason: str | None, control: str, token: str | None,
            as_json: bool) -> None:
    try:
        rollout_id = _resolve(control, token, rollout)
        record = call(control, token, "POST", f"/v1/rollouts/{rollout_id}/{name}",
                       {"reason": reason} if reason else None)
    except TierlinkError as exc:
        fail(exc)
    _show_record(record, as_json, f"rollout {rollout_id}")


@app.command("promote")
def promote_cmd(rollout: str = RolloutId, reason: str | None = Reason,
                control: str = ControlUrl, admin_token: str | None = AdminToken,
                as_json: bool = AsJson) -> None:
    """Skip the current stage's gates: the next stage, or all traffic after the last."""
    _action("promote", rollout, reason, control, admin_token, as_json)


@app.command("rollback")
def rollback_cmd(rollout: str = RolloutId, reason: str | None = Reason,
                 control: str = ControlUrl, admin_token: str | None = AdminToken,
                 as_json: bool = AsJson) -> None:
    """Every node of the tier back to the previous version (also after a promotion)."""
    _action("rollback", rollout, reason, control, admin_token, as_json)


@app.command("pause")
def pause_cmd(rollout: str = RolloutId, reason: str | None = Reason,
              control: str = ControlUrl, admin_token: str | None = AdminToken,
              as_json: bool = AsJson) -> None:
    """Freeze the rollout where it is (an install failure still rolls it back)."""
    _action("pause", rollout, reason, control, admin_token, as_json)


@app.command("resume")
def resume_cmd(rollout: str = RolloutId, reason: str | None = Reason,
               control: str = ControlUrl, admin_token: str | None = AdminToken,
               as_json: bool = AsJson) -> None:
    """Continue a paused rollout; its current stage starts over (new window, new soak)."""
    _action("resume", rollout, reason, control, admin_token, as_json)


# -- output -------------------------------------------------------------------------------


def _show_record(record: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(record, indent=2))
        return
    Console().print(f"{title}: {record['describe']}", highlight=False)


def _list_table(url: str, records: list[dict[str, Any]], now: float | None) -> Table:
    table = Table(title=f"rollouts at {url}")
    for col in ("id", "model", "version", "previous", "cohort", "phase", "stage", "share",
                "age", "last reason"):
        table.add_column(col, overflow="fold")
    clock = time.time() if now is None else now
    for r in records:
        spec = r["spec"]
        cohort = ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
        table.add_row(str(r["id"]), spec["name"], spec["version"], spec["previous"],
                      cohort or "all", r["phase"], _stage(r), f"{r['share']:.0%}",
                      _age(clock - r["created_at"]), _last_reason(r))
    return table


def _print_details(record: dict[str, Any]) -> None:
    out = Console()
    out.print(f"rollout {record['id']}: {record['describe']}", highlight=False)
    nodes = Table(title="assignments")
    for col in ("node", "version", "weight"):
        nodes.add_column(col)
    for a in record["assignments"]:
        nodes.add_row(a["node_id"], a["version"], f"{a['weight']:.2f}")
    out.print(nodes)
    verdicts = record["state"].get("verdicts") or []
    if verdicts:
        gates = Table(title="last gate verdicts")
        for col in ("gate", "outcome", "reason"):
            gates.add_column(col, overflow="fold")
        for v in verdicts:
            gates.add_row(v["gate"], v["outcome"], v["reason"])
        out.print(gates)
    log = Table(title="transitions")
    for col in ("after", "from", "to", "reason"):
        log.add_column(col, overflow="fold")
    for t in record.get("transitions", []):
        log.add_row(_age(t["at"] - record["created_at"]), t["from"], t["to"], t["reason"])
    out.print(log)


def _stage(record: dict[str, Any]) -> str:
    stages = record["spec"]["stages"]
    index = record["state"]["stage"]
    return f"{index + 1}/{len(stages)} ({stages[index]:.0%})"


def _last_reason(record: dict[str, Any]) -> str:
    history = record["state"].get("history") or []
    return str(history[-1]["reason"]) if history else "created"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
