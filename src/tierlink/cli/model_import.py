"""``tierlink model import`` and ``tierlink model imported``: users' own models (ONNX graphs,
or Python classes) into the local model store (``modelstore/``), where fleet files name
them like zoo models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.core.progress import Reporter
from tierlink.errors import ConfigError, TierlinkError

if TYPE_CHECKING:
    from tierlink.models.card import ModelCard

console = Console(stderr=True)


def import_cmd(
    name: str = typer.Argument(..., help="the name fleets serve it under, e.g. spam-small"),
    model: Path = typer.Argument(..., help="the model: an .onnx file, a Python model's "
                                           "source (its .py file, or the directory holding "
                                           "it and its data files), or the directory of a "
                                           "multi-exit model's ONNX segments"),
    task: str = typer.Option(..., "--task", help="the task it answers, e.g. spam"),
    tier: str = typer.Option(..., "--tier", help="device, edge or cloud: where it is meant "
                                                 "to run"),
    data: Path = typer.Option(..., "--data", help="labelled data: an .npz with x and y, or a "
                                                  "folder of .npy samples with labels.csv"),
    kind: str | None = typer.Option(None, help="output kind of a new task: classification "
                                               "(default), multilabel, detection, regression, "
                                               "embedding"),
    output: list[str] = typer.Option([], help="ROLE=OUTPUT: which output plays which role, "
                                              "e.g. scores=logits (repeatable)"),
    labels: str | None = typer.Option(None, help="class names of a new task, comma separated"),
    option: list[str] = typer.Option([], help="KEY=VALUE option of the output kind, e.g. "
                                              "probabilities=true (repeatable)"),
    fleet: Path | None = typer.Option(None, help="a fleet YAML whose tasks: declares the task"),
    calib_share: float = typer.Option(0.5, help="share of the data used for calibration"),
    seed: int = typer.Option(0, help="seed of the calibration/evaluation split"),
    providers: str = typer.Option("cpu", help="execution providers in order, e.g. cuda,cpu"),
    version: str = typer.Option("1", help="the version its card states"),
    entry: str = typer.Option("model:Model", help="a Python model's class, MODULE:CLASS "
                                                  "(with load() and predict(inputs))"),
    model_format: str | None = typer.Option(None, "--format", help="onnx, python, "
                                            "multi-exit or an installed runtime's format "
                                            "(default: onnx for an .onnx file, else python)"),
    control: str | None = typer.Option(None, help="also publish it, signed, to this control "
                                                  "plane's repository (as `model publish`)"),
    key: Path | None = typer.Option(None, help="private signing key, with --control"),
    notes: str = typer.Option("imported", help="what this version is, with --control"),
    admin_token: str | None = typer.Option(None, envvar="TIERLINK_ADMIN_TOKEN",
                                           help="the control plane's admin token"),
    as_json: bool = typer.Option(False, "--json", help="print the card as JSON"),
) -> None:
    """Measure a model on its own labelled data (metric, calibration, latency per provider),
    write its card and install it in the local model store."""
    from tierlink.models.onnx import parse_providers
    from tierlink.modelstore.importer import ImportRequest, import_model
    from tierlink.modelstore.store import ModelStore

    try:
        req = ImportRequest(
            name=name, model=model, task=task, tier=tier, data=data, kind=kind,
            declared=_declared(fleet, task), outputs=_pairs(output, "--output"),
            labels=tuple(x.strip() for x in labels.split(",")) if labels else (),
            options={k: _value(v) for k, v in _pairs(option, "--option").items()},
            calib_share=calib_share, seed=seed,
            providers=parse_providers(providers, "--providers"), version=version,
            entry=entry, model_format=model_format)
        if control is not None and key is None:
            raise ConfigError("--control needs --key (the publisher's private key)",
                              hint="make one with `tierlink model keygen --out KEY`")
        store = ModelStore.default()
        # reading, running, timing: blocking steps, said as stages, a heartbeat between
        with Reporter(enabled=not as_json).phase(f"importing {name}") as phase:
            card = import_model(req, store, say=phase.stage)
        published = (_publish(store, card, control, key, notes, admin_token)  # type: ignore[arg-type]
                     if control is not None else None)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        out = card.to_dict() | ({"published": published} if published else {})
        print(json.dumps(out, indent=2))
        return
    _print_card(card)
    if published:
        console.print(f"published {card.name} version {card.version} to {control}")


def _publish(store: Any, card: ModelCard, control: str, key: Path, notes: str,
             admin_token: str | None) -> dict[str, Any]:
    """Sign and publish the installed files, validated by the figures the import measured
    (the evaluation part of the model's own data)."""
    import time

    from tierlink.cli.model import run_publish
    from tierlink.repo.manifest import Validation

    onnx, card_path = store.paths(card.name)
    data = card.data
    assert data is not None  # an imported card was measured on data
    validation = Validation(dataset=f"{card.task}:{data.sha256[:12]}", split="eval",
                            n=data.eval_samples, accuracy=card.test_accuracy,
                            measured_at=time.time())
    entry, created = run_publish(card.name, onnx, card_path, card.version, notes,
                                 key, control, admin_token=admin_token, validation=validation)
    return {**entry.to_dict(), "created": created}


def imported_cmd(task: str | None = typer.Option(None, help="only this task's models"),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    """The models in the local model store."""
    from tierlink.modelstore.store import ModelStore

    store = ModelStore.default()
    cards = [store.card(n) for n in store.names(task)]
    if as_json:
        print(json.dumps([c.to_dict() for c in cards], indent=2))
        return
    table = Table(title=f"model store {store.root}")
    for col in ("model", "version", "task", "kind", "tier", "metric", "ms (b1 p50)",
                "provider"):
        table.add_column(col)
    for c in cards:
        table.add_row(c.name, c.version, c.task, c.kind, c.tier, _metric(c),
                      f"{c.latency_ms['batch1_p50']:.3f}", c.provider)
    Console().print(table)


def catalog_cmd(profile: str = typer.Option("full", help="the zoo's build profile"),
                as_json: bool = typer.Option(False, "--json")) -> None:
    """Every model name this machine resolves, by source: the local store (imported), the
    zoo (built on first use), and any source a package registers."""
    from tierlink.models.catalog import Catalog, SourceOptions

    listing = Catalog.default(SourceOptions(profile=profile, progress=False)).describe()
    if as_json:
        print(json.dumps(listing, indent=2))
        return
    table = Table(title="model catalog (asked in this order)")
    table.add_column("source")
    table.add_column("models")
    for source, names in listing.items():
        table.add_row(source, ", ".join(names) or "-")
    Console().print(table)


def _print_card(card: ModelCard) -> None:
    samples = card.data.eval_samples if card.data else 0
    console.print(f"imported {card.name} ({card.task}, {card.kind}, {card.tier}): "
                  f"{_metric(card)} on {samples} evaluation samples, "
                  f"{card.latency_ms['batch1_p50']:.3f} ms per request on "
                  f"{card.provider}, temperature {card.temperature:.3f}, "
                  f"{'cascadable' if card.cascadable else 'not cascadable'}")


def _metric(card: ModelCard) -> str:
    return f"{card.metric} {card.test_accuracy:.4f}"


def _declared(fleet: Path | None, task: str) -> Any:
    if fleet is None:
        return None
    from tierlink.fleet.config import load_fleet

    declared = load_fleet(fleet).tasks.get(task)
    if declared is None:
        raise ConfigError(f"{fleet} declares no task {task!r} under tasks:")
    return declared


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return float(text) if any(c in text for c in ".e") else int(text)
    except ValueError:
        return text
