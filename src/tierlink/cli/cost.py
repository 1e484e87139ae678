"""``tierlink cost``: the fleet's bill, grouped by what spends it (:mod:`tierlink.telemetry.
bill`) — the last window's from Prometheus, or since the nodes started from the nodes the
control plane lists (or those named)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail, fleet_verify
from tierlink.cli.operator import AdminToken, ControlUrl
from tierlink.errors import ConfigError, TierlinkError
from tierlink.telemetry.bill import BillReport
from tierlink.telemetry.metrics import COST_LABELS

BY_HELP = f"labels to group by, comma separated: {', '.join(COST_LABELS)}"


def cost(by: str = typer.Option("tier,part", help=BY_HELP),
         prometheus: str | None = typer.Option(
             None, help="a Prometheus scraping the fleet: the bill of the last --window"),
         window: str | None = typer.Option(None, help="with --prometheus: how far back "
                                                      "(15m, 1h, 1d, ...; default 1h)"),
         node: list[str] = typer.Option([], help="a node's URL (repeatable); default: the "
                                                 "nodes the control plane lists"),
         control: str = ControlUrl, admin_token: str | None = AdminToken,
         as_json: bool = typer.Option(False, "--json", help="print the bill as JSON")) -> None:
    """What the fleet's answers cost, grouped by task, model, version, path kind, site,
    tier and part (compute or transfer), with the cost per request where it applies."""
    import httpx

    from tierlink.telemetry import bill

    try:
        labels = bill.parse_by(by)
        if window is not None and not prometheus:
            raise ConfigError("--window needs --prometheus: the nodes' own counters hold "
                              "only what they counted since they started",
                              hint="add --prometheus URL, or drop --window")
        with httpx.Client(timeout=10.0, trust_env=False, verify=fleet_verify()) as client:
            if prometheus:
                report = bill.from_prometheus(client, prometheus, window or "1h", labels)
            else:
                urls = node or _fleet_nodes(control, admin_token)
                report = bill.from_nodes(client, urls, labels)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
        return
    _print(report)


def _fleet_nodes(control: str, token: str | None) -> list[str]:
    """The addresses of the nodes the control plane lists."""
    from tierlink.cli.operator import call

    nodes = call(control, token, "GET", "/v1/nodes")["nodes"]
    return [n["address"] for n in nodes]


def _print(report: BillReport) -> None:
    table = Table(title=f"the bill, {report.window}: ${report.usd:.6g}")
    for label in report.by:
        table.add_column(label)
    for col in ("USD", "share", "requests", "USD per 1k requests"):
        table.add_column(col, justify="right")
    for line in report.lines:
        per_1k = line.usd_per_1k
        table.add_row(*line.group, f"{line.usd:.6g}",
                      f"{line.usd / report.usd:.1%}" if report.usd else "",
                      "" if line.requests is None else f"{line.requests:.0f}",
                      "" if per_1k is None else f"{per_1k:.6g}")
    Console().print(table)
