"""How every command reports a ``TierlinkError``: the message and its hint on stderr, exit 2."""

from __future__ import annotations

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
