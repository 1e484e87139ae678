"""The models a command runs: the zoo's (built, variants made, on first use), the photo
model, the early-exit net, and users' own from the local model store — by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True)


def zoo_models(profile: str, wanted: tuple[str, ...] = (), progress: bool = True,
               ) -> tuple[dict[str, tuple[Path, Path]], dict]:
    """Build what ``wanted`` needs (every task it names; quantized variants such as
    ``fmnist-small-fp16`` are made on first use); model name -> (onnx, card) and a summary
    for reports. Without ``wanted``: the Fashion-MNIST zoo."""
    from tierlink.quantize.variants import with_variants
    from tierlink.zoo import ensure_zoo
    from tierlink.zoo.exits import EXITS_NAME
    from tierlink.zoo.photo_models import photo_models
    from tierlink.zoo.profiles import TASKS

    special = {EXITS_NAME}  # built by their own recipes, not zoo variants
    tasks = sorted({t for t in TASKS for name in wanted
                    if name.startswith(f"{t}-") and name not in special})
    models: dict[str, tuple[Path, Path]] = {}
    summary: dict[str, dict[str, Any]] = {}
    for task in tasks if wanted else ["fmnist"]:
        zoo = with_variants(ensure_zoo(task=task, profile=profile, progress=progress),
                            [n for n in wanted if n.startswith(f"{task}-") and n not in special],
                            say=lambda m: console.print(f"[dim]{m}[/dim]"))
        models.update({name: (zoo.path(name), zoo.card_path(name)) for name in zoo.cards})
        summary.update({name: {"params": c.params, "test_accuracy": c.test_accuracy,
                               "latency_ms_batch1_p50": c.latency_ms["batch1_p50"],
                               "tier": c.tier, "precision": c.precision,
                               "temperature": c.temperature}
                        for name, c in zoo.cards.items() if name in wanted or not wanted})
    # imagenet-mobilenetv2: exported, with its split profile, on first use (not trained here)
    models.update(photo_models(wanted, say=lambda m: console.print(f"[dim]{m}[/dim]")))
    models.update(imported_models(wanted))  # users' own models (`tierlink model import`)
    if EXITS_NAME in wanted:  # the multi-exit net (early exit), trained on first use
        from tierlink.zoo.exits import ensure_exits

        built = ensure_exits(profile, progress=progress)
        models[EXITS_NAME] = (built.whole_path, built.card_path)
    return models, summary


def imported_models(wanted: tuple[str, ...]) -> dict[str, tuple[Path, Path]]:
    """Name -> (onnx, card) of the wanted models the local model store holds."""
    from tierlink.modelstore.store import ModelStore, models_of

    return models_of(ModelStore.default(), list(wanted))
