"""``tierlink split profile``: time every head and tail of a zoo model on this machine."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.errors import TierlinkError

console = Console(stderr=True)


def profile_cmd(
    model: str = typer.Argument(..., help="a zoo model name, e.g. fmnist-large, or an "
                                          "imported one"),
    task: str = typer.Option("fmnist", help="the zoo task of MODEL"),
    profile: str = typer.Option("full", help="zoo profile: full or test"),
    rounds: int = typer.Option(30, help="interleaved timing rounds"),
    as_json: bool = typer.Option(False, "--json", help="print the profile as JSON"),
) -> None:
    """Measure head and tail latency at every cut (1 thread, batch 1, interleaved) and each
    feature codec's payload size and encode / decode time there, and save it beside the
    model card as <model>.splits.json, where nodes read it and report it
    with their heartbeat."""
    from tierlink.models.split_profile import profile_path, save_profile
    from tierlink.split.profile import profile_model

    try:
        onnx, card_path, sha256, sample = _model(model, task, profile, as_json)
        result = profile_model(model, onnx, sample, sha256, rounds=rounds)
        save_profile(result, profile_path(card_path))
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    table = Table(title=f"{model} on {result.host}: whole model {result.full_ms:.3f} ms")
    codecs = [c.codec for c in result.points[0].codecs] if result.points else []
    for col in ("cut", "head ms", "tail ms", "KB / sample",
                *(f"{c} KB (enc ms)" for c in codecs)):
        table.add_column(col)
    for p in result.points:
        table.add_row(p.cut, f"{p.head_ms:.3f}", f"{p.tail_ms:.3f}",
                      f"{p.feature_bytes / 1024:.1f}",
                      *(f"{c.wire_bytes / 1024:.1f} ({c.encode_ms:.3f})" for c in p.codecs))
    Console().print(table)
    console.print(f"saved to {profile_path(card_path)}")


def _model(model: str, task: str, profile: str, quiet: bool) -> tuple[Any, Any, str, Any]:
    """(onnx, card path, sha256, one sample input) of a zoo or an imported model."""
    from tierlink.modelstore.store import ModelStore

    store = ModelStore.default()
    if store.has(model):
        part = store.single_input_classifier(model, "split profile")
        onnx, card_path = store.graph(model, "split profile"), store.paths(model)[1]
        return onnx, card_path, store.card(model).sha256, part.input[:1]
    from tierlink.zoo import ensure_zoo
    from tierlink.zoo.datasets import load_splits

    zoo = ensure_zoo(task=task, profile=profile, progress=not quiet)
    return (zoo.path(model), zoo.card_path(model), zoo.card(model).sha256,
            load_splits(task).test.input[:1])
