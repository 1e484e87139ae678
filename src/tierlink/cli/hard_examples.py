"""``tierlink hard-examples``: list and export the control plane's hard-example store.

Hard examples are inputs a node escalated for low confidence and was allowed to send (see
``tierlink.node.hard_examples``). ``list`` shows their metadata; ``export`` writes an
``.npz`` for retraining (``inputs``, ``labels`` (-1 unknown), ``predictions``,
``confidences``, ``ids``, ``models``, ``nodes``, ``privacy``, ...).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import ADMIN_TOKEN_HELP, admin_authorization, fail, fleet_verify
from tierlink.errors import TierlinkError

if TYPE_CHECKING:
    from tierlink.control.client import ControlClient

app = typer.Typer(help="List and export hard examples kept by the control plane.",
                  no_args_is_help=True)
console = Console(stderr=True)
TIMEOUT_S = 60.0  # an export of the whole store can be tens of megabytes



def _client(url: str, token: str | None = None) -> ControlClient:
    """The control plane client (tests replace this to talk to an in-process app). On a
    fleet with TLS it verifies the control plane with the fleet CA in ``TIERLINK_CA`` (and
    presents ``TIERLINK_CERT`` / ``TIERLINK_KEY``), as the other operator commands do."""
    import ssl

    from tierlink.control.client import ControlClient

    verify = fleet_verify()
    return ControlClient(url, timeout_s=TIMEOUT_S, authorization=admin_authorization(token),
                         tls=verify if isinstance(verify, ssl.SSLContext) else None)


async def _page(url: str, model: str | None, node: str | None, limit: int,
                token: str | None = None) -> list[dict[str, Any]]:
    async with _client(url, token) as client:
        page = await client.hard_examples(model=model, node=node, limit=limit)
    return list(page["examples"])


async def _export(url: str, model: str | None, node: str | None,
                  token: str | None = None) -> bytes:
    async with _client(url, token) as client:
        return await client.export_hard_examples(model=model, node=node)


@app.command("list")
def list_cmd(control_url: str = typer.Argument(..., help="control plane URL"),
             model: str | None = typer.Option(None, help="only this model's examples"),
             node: str | None = typer.Option(None, help="only those from this node"),
             limit: int = typer.Option(50, min=1, max=1000, help="at most this many (oldest first)"),
             as_json: bool = typer.Option(False, "--json", help="print JSON"),
             admin_token: str | None = typer.Option(None, envvar="TIERLINK_ADMIN_TOKEN",
                                                    help=ADMIN_TOKEN_HELP)) -> None:
    """Show stored hard examples (metadata, not inputs)."""
    try:
        examples = asyncio.run(_page(control_url, model, node, limit, admin_token))
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(examples, indent=2))
        return
    Console().print(_table(control_url, examples))


def _table(url: str, examples: list[dict[str, Any]]) -> Table:
    table = Table(title=f"hard examples at {url} ({len(examples)} shown)")
    for col in ("id", "node", "model", "privacy", "pred", "conf", "label", "received"):
        table.add_column(col)
    for e in examples:
        label = "?" if e["label"] < 0 else str(e["label"])
        when = dt.datetime.fromtimestamp(e["received_at"]).strftime("%H:%M:%S")
        table.add_row(str(e["id"]), e["node_id"], e["model"], e["privacy"],
                      str(e["prediction"]), f"{e['confidence']:.3f}", label, when)
    return table


@app.command("export")
def export_cmd(control_url: str = typer.Argument(..., help="control plane URL"),
               out: Path = typer.Option(..., "--out", help="the .npz file to write"),
               model: str | None = typer.Option(None, help="only this model's examples"),
               node: str | None = typer.Option(None, help="only those from this node"),
               admin_token: str | None = typer.Option(None, envvar="TIERLINK_ADMIN_TOKEN",
                                                      help=ADMIN_TOKEN_HELP)) -> None:
    """Write stored hard examples (with their inputs) to an .npz for retraining."""
    try:
        data = asyncio.run(_export(control_url, model, node, admin_token))
    except TierlinkError as exc:
        fail(exc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    console.print(f"wrote {out} ({len(data):,} bytes, {_count(out)} examples)")


def _count(path: Path) -> int:
    import numpy as np

    with np.load(path) as npz:
        return int(npz["ids"].shape[0])
