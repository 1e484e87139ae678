"""``tierlink enroll``: the operator's side of node identity (tokens, listing, revocation).

A node enrolls by itself the first time it starts with ``enroll_token`` in its spec (``tierlink
up`` makes one per fleet); see :mod:`tierlink.control.identity`.
"""

from __future__ import annotations

import datetime as dt
import json

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.cli.operator import AdminToken, ControlUrl, call
from tierlink.errors import TierlinkError

app = typer.Typer(help="Enrollment tokens and node credentials (operators).",
                  no_args_is_help=True)
console = Console(stderr=True)

@app.command("token")
def token_cmd(control: str = ControlUrl, admin_token: str | None = AdminToken,
              ttl: float | None = typer.Option(None, help="seconds it stays valid (default: "
                                                          "no expiry)"),
              uses: int | None = typer.Option(None, min=1, help="nodes it may enroll"),
              note: str = typer.Option("", help="what it is for"),
              as_json: bool = typer.Option(False, "--json")) -> None:
    """Create an enrollment token (shown once: the control plane keeps only its hash)."""
    try:
        body = call(control, admin_token, "POST", "/v1/enrollment-tokens",
                    {"ttl_s": ttl, "uses": uses, "note": note})
    except TierlinkError as exc:
        fail(exc)
    print(json.dumps(body) if as_json else body["token"])


@app.command("list")
def list_cmd(control: str = ControlUrl, admin_token: str | None = AdminToken,
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Enrolled nodes, revoked ones marked."""
    try:
        nodes = call(control, admin_token, "GET", "/v1/credentials")["nodes"]
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(nodes, indent=2))
        return
    table = Table(title=f"enrolled nodes at {control}")
    for col in ("node", "tier", "enrolled", "revoked"):
        table.add_column(col)
    for n in nodes:
        table.add_row(n["node_id"], n["tier"], _when(n["enrolled_at"]),
                      _when(n["revoked_at"]) if n["revoked_at"] else "")
    Console().print(table)


@app.command("revoke")
def revoke_cmd(node_id: str = typer.Argument(..., help="the node to cut off"),
               control: str = ControlUrl, admin_token: str | None = AdminToken) -> None:
    """Revoke a node: every call of it is refused from now on and it leaves the registry."""
    try:
        call(control, admin_token, "POST", f"/v1/credentials/{node_id}/revoke")
    except TierlinkError as exc:
        fail(exc)
    console.print(f"revoked {node_id}")


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")
