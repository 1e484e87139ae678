"""``tierlink quantize``: make lower-precision variants of zoo models and judge them.

The lead registers :func:`quantize` on the typer app (``app.command()(quantize)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from tierlink.cli.errors import fail
from tierlink.core.progress import Reporter, as_reporter
from tierlink.errors import TierlinkError

CLI_PRECISIONS = ("int8", "int8dyn", "fp16", "int4w", "mixed")
console = Console(stderr=True)


def quantize(
    models: list[str] | None = typer.Argument(
        None, help="base models to quantize (default: every base model of the zoo)"),
    precision: str = typer.Option(
        "int8", help="int8 | int8dyn | fp16 | int4w | mixed | all (comma-separated works)"),
    calibration: str = typer.Option("minmax", help="static INT8 ranges: minmax | entropy | "
                                                   "percentile"),
    calib_size: int = typer.Option(512, help="calibration-split images for static INT8"),
    budget: float = typer.Option(0.5, help="accuracy budget in points below FP32 (mixed "
                                           "search on the calibration split; verdicts)"),
    plot_dir: Path | None = typer.Option(None, "--plot-dir", help="where the sensitivity "
                                         "PNGs go (default: <zoo>/plots)"),
    profile: str = typer.Option("full", help="zoo build profile: full | test"),
    task: str = typer.Option("fmnist", help="zoo task"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output, no bars"),
) -> None:
    """Quantize zoo models (static/dynamic INT8, FP16, INT4 weight-only, mixed precision),
    register each variant in the zoo with a measured card, and say whether it pays."""
    from tierlink.quantize.settings import QuantSettings, precision_for

    try:
        precisions = _precisions(precision)
        settings = [QuantSettings(precision=precision_for(p), calibration=calibration,
                                  calib_size=calib_size, budget_pt=budget) for p in precisions]
        if models and _imported(models):
            _quantize_imported(models, settings, as_json)
            return
        doc, mixed = run_quantize(models, settings, profile=profile, task=task,
                                  plot_dir=plot_dir, progress=not as_json)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print(doc, mixed, budget)


def _imported(models: list[str]) -> bool:
    """Whether MODELS are users' models of the model store (all of them, or refused)."""
    from tierlink.errors import QuantizationError
    from tierlink.modelstore.store import ModelStore

    store = ModelStore.default()
    held = [m for m in models if store.has(m)]
    if held and len(held) != len(models):
        raise QuantizationError(f"quantize zoo models and imported models separately: "
                                f"{held} are imported, {sorted(set(models) - set(held))} not")
    return bool(held)


def _quantize_imported(models: list[str], settings: list[Any], as_json: bool) -> None:
    from tierlink.modelstore.quantize import quantize_imported
    from tierlink.modelstore.store import ModelStore

    store = ModelStore.default()
    reporter = as_reporter(not as_json)
    cards = []
    with reporter.phase("quantize", len(models) * len(settings), heartbeat=True) as phase:
        for m in models:
            for s in settings:
                cards.append(quantize_imported(store, m, s, phase.stage))
                phase.advance()
    if as_json:
        print(json.dumps([c.to_dict() for c in cards], indent=2))
        return
    for c in cards:
        lin = c.lineage
        assert lin is not None  # a variant's card has its lineage
        console.print(f"{c.name}: {lin.precision}, {100 * c.test_accuracy:.2f}% "
                      f"({100 * lin.accuracy_delta:+.2f} pt, agreement "
                      f"{100 * lin.agreement:.2f}%), {c.size_bytes / 1e6:.2f} MB, "
                      f"speedup {lin.speedup.get('batch1', 0):.2f}x at batch 1: "
                      f"{lin.verdict}")


def _precisions(text: str) -> list[str]:
    from tierlink.errors import QuantizationError

    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return list(CLI_PRECISIONS)
    bad = [p for p in names if p not in CLI_PRECISIONS]
    if bad or not names:
        raise QuantizationError(f"unknown --precision {text!r}",
                                hint=f"use one of {', '.join(CLI_PRECISIONS)} or all")
    return names


def run_quantize(models: list[str] | None, settings: list[Any], *, profile: str, task: str,
                 plot_dir: Path | None, progress: bool | Reporter
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Make every (model, settings) variant, one phase over them all on ``progress`` (a
    reporter; ``True``: stderr). Returns the report as JSON-ready data and the cards of the
    mixed variants by parent (for the sensitivity tables)."""
    from tierlink.quantize.report import plot_sensitivity, sensitivity_rows, variant_row
    from tierlink.zoo import ensure_zoo
    from tierlink.zoo.variants import eval_data, make_variant

    reporter = as_reporter(progress)
    zoo = ensure_zoo(task=task, profile=profile, progress=reporter)
    names = list(models) if models else list(zoo.base_names())
    for name in names:
        zoo.card(name)  # a clear error before any work
    data = eval_data(zoo)
    doc: dict[str, Any] = {"zoo": str(zoo.root), "variants": [], "sensitivity": {}, "plots": {}}
    mixed: dict[str, Any] = {}
    # Each variant is one blocking call: the heartbeat says it is still working.
    with reporter.phase("quantize", len(names) * len(settings), heartbeat=True) as phase:
        for name in names:
            for s in settings:
                card = make_variant(zoo, name, s, data=data, say=phase.stage)
                doc["variants"].append(variant_row(card, zoo.card(name), s.budget_pt))
                if s.precision == "mixed":
                    doc["sensitivity"][name] = sensitivity_rows(card)
                    png = (plot_dir or zoo.root / "plots") / f"{name}-sensitivity.png"
                    doc["plots"][name] = str(plot_sensitivity(card, png))
                    mixed[name] = card
                phase.advance()
    return doc, mixed


def _print(doc: dict[str, Any], mixed: dict[str, Any], budget: float) -> None:
    import sys

    from tierlink.quantize.report import sensitivity_table, variants_table

    out = Console(width=None if sys.stdout.isatty() else 150)
    for card in mixed.values():
        out.print(sensitivity_table(card))
    out.print(variants_table(doc["variants"], budget))
    for name, png in doc["plots"].items():
        out.print(f"sensitivity plot of {name}: {png}")
    out.print("verdict: [b]pays[/b] = within budget and >= 1.10x faster at batch 1; "
              "[b]smaller only[/b] = within budget, not slower, file <= 90%; else "
              "[b]does not pay[/b]")
