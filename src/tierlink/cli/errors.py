"""How every command reports a ``TierlinkError`` (the message and its hint on stderr, exit 2),
and the operator credential commands that call the control plane share."""

from __future__ import annotations

import os
import ssl
from typing import NoReturn

import typer
from rich.console import Console

from tierlink.errors import TierlinkError

_console = Console(stderr=True)


def fail(exc: TierlinkError) -> NoReturn:
    """Print what went wrong and what to do, then exit with status 2."""
    _console.print(f"[red]error:[/red] {exc.message}")
    if exc.hint:
        _console.print(f"[yellow]hint:[/yellow] {exc.hint}")
    raise typer.Exit(2) from None


# Commands that call the control plane as an operator take the control plane's admin token
# (``tierlink control`` writes it to <db>.admin-token; ``tierlink up`` to <run dir>/admin.token).
ADMIN_TOKEN_HELP = "the control plane's admin token (or set TIERLINK_ADMIN_TOKEN)"


def admin_authorization(token: str | None) -> str | None:
    """The ``Authorization`` header value for an operator, None without a token (an open
    control plane)."""
    return f"Bearer admin:{token.strip()}" if token and token.strip() else None


def fleet_verify() -> ssl.SSLContext | bool:
    """How operator commands verify a control plane on HTTPS: the fleet CA in
    ``TIERLINK_CA`` (and, where ``TIERLINK_CERT`` / ``TIERLINK_KEY`` name them, the
    operator's certificate; `tierlink up --tls` prints the three), else the system's trust."""
    ca = os.environ.get("TIERLINK_CA")
    if not ca:
        return True
    from pathlib import Path

    from tierlink.security.tls import TlsFiles, client_context

    cert, key = os.environ.get("TIERLINK_CERT"), os.environ.get("TIERLINK_KEY")
    return client_context(TlsFiles(Path(ca), Path(cert) if cert else None,
                                   Path(key) if key else None))


def admin_headers(token: str | None) -> dict[str, str]:
    value = admin_authorization(token)
    return {"authorization": value} if value else {}
