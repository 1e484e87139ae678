"""``tierlink zoo calibration``: how well each model's confidence is calibrated."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.errors import ConfigError, TierlinkError

console = Console(stderr=True)


def calibration(
    task: str = typer.Option("fmnist", help="fmnist (Fashion-MNIST), mnist, or the task of "
                                            "imported models"),
    profile: str = typer.Option("full", help="zoo profile: full or test"),
    png: Path | None = typer.Option(None, help="write reliability diagrams (test split) here"),
    as_json: bool = typer.Option(False, "--json", help="print the calibration as JSON"),
) -> None:
    """Temperature, ECE and NLL before/after scaling for every model of the zoo (fitted
    on the calibration split; the test columns are a held-out check)."""
    from tierlink.zoo import ensure_zoo
    from tierlink.zoo.profiles import TASKS

    if task not in TASKS:
        _imported(task, as_json)
        return
    try:
        zoo = ensure_zoo(task=task, profile=profile, progress=not as_json)
        if png:
            _plot(zoo, png)
    except TierlinkError as exc:
        fail(exc)
    rows = {n: c.calibration.to_dict() for n, c in zoo.cards.items() if c.calibration}
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"calibration ({task}, temperature fitted on the calibration split)")
    for col in ("model", "T", "ECE calib before -> after", "ECE test before -> after",
                "NLL calib before -> after"):
        table.add_column(col)
    for name, r in rows.items():
        table.add_row(name, f"{r['temperature']:.3f}",
                      f"{100 * r['ece_before']:.2f}% -> {100 * r['ece_after']:.2f}%",
                      f"{100 * r['test_ece_before']:.2f}% -> {100 * r['test_ece_after']:.2f}%",
                      f"{r['nll_before']:.4f} -> {r['nll_after']:.4f}")
    Console().print(table)
    if png:
        console.print(f"reliability diagrams written to {png}")


def _imported(task: str, as_json: bool) -> None:
    """The calibration each imported model of ``task`` was measured with at import."""
    from tierlink.modelstore.store import ModelStore

    store = ModelStore.default()
    rows = {n: {"temperature": c.temperature,
                **(c.calibration.to_dict() if c.calibration else {})}
            for n in store.names(task) if (c := store.card(n))}
    if not rows:
        fail(ConfigError(f"no zoo task and no imported model of task {task!r}",
                         hint="`tierlink model imported` lists the model store"))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"calibration ({task}, imported; temperature fitted on the "
                        "calibration part of each model's data)")
    for col in ("model", "T", "ECE calib before -> after", "ECE eval before -> after",
                "NLL calib before -> after"):
        table.add_column(col)
    for name, r in rows.items():
        table.add_row(name, f"{r['temperature']:.3f}", _pair(r, "ece_", 100, "%"),
                      _pair(r, "eval_ece_", 100, "%"), _pair(r, "nll_", 1, ""))
    Console().print(table)


def _pair(r: dict, prefix: str, scale: float, unit: str) -> str:
    before, after = r.get(f"{prefix}before"), r.get(f"{prefix}after")
    if before is None or after is None:
        return "-"
    return f"{scale * before:.2f}{unit} -> {scale * after:.2f}{unit}"


def _plot(zoo: object, png: Path) -> None:
    from tierlink.models.evaluate import onnx_logits
    from tierlink.zoo.datasets import load_splits
    from tierlink.zoo.plots import reliability_png

    test = load_splits(zoo.task).test  # type: ignore[attr-defined]
    curves = {name: (onnx_logits(zoo.path(name), test.input), test.labels,  # type: ignore[attr-defined]
                     card.temperature)
              for name, card in zoo.cards.items()  # type: ignore[attr-defined]
              if card.lineage is None}
    reliability_png(curves, png, title=f"{zoo.task}: reliability on the test split")  # type: ignore[attr-defined]
