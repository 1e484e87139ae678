"""The zoo's trained models, shipped with tierlink: a read-only source the zoo takes a model
from before it trains one.

``zoo/shipped/<profile>/<name>/<version>/`` holds ``model.onnx`` and ``card.json`` in the
model layer's layout (:mod:`tierlink.models.layout`) — the Fashion-MNIST families of both
profiles and the devices' FP16 variant, the very files the example fleet's thresholds were
tuned on (so a fresh clone runs the demo without training or re-tuning). A shipped model is
taken only when its card is what this code would build (profile, task, version, the
recipe's fingerprint) and its file matches the card's sha256 — checked by the caller's
``problem`` function, the same one that judges a cached model; otherwise the zoo says why
and trains it. ``tierlink zoo build --rebuild`` trains them again and ``--ship`` writes a
build back here.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from tierlink.models.card import ModelCard, load_card
from tierlink.models.layout import CARD_FILE, MODEL_FILE, Layout

SHIPPED = Path(__file__).resolve().parent / "shipped"
# Derived variants shipped beside the trained models: the ones the example fleets run.
VARIANTS = ("fmnist-small-fp16",)

# (name, its card, its onnx) -> why it does not fit, or None
Problem = Callable[[str, ModelCard, Path], "str | None"]
Say = Callable[[str], None]


def shipped_root(profile: str) -> Path:
    """Where ``profile``'s shipped models are (the directory may not exist)."""
    return SHIPPED / profile


def shipped_names(profile: str) -> tuple[str, ...]:
    root = shipped_root(profile)
    return tuple(Layout(root).names()) if root.is_dir() else ()


def take(root: Path, profile: str, names: Sequence[str], problem: Problem,
         say: Say) -> tuple[str, ...]:
    """Install in the zoo at ``root`` each of ``names`` that ``profile`` ships and
    ``problem`` finds nothing wrong with; the names taken. A shipped model that does not
    match is said (with why) and left out: the zoo trains it."""
    taken = []
    shipped = set(shipped_names(profile))
    for name in names:
        if name not in shipped:
            continue
        source = Layout(shipped_root(profile)).dir(name)
        card = load_card(source / CARD_FILE)
        why = problem(name, card, source / MODEL_FILE)
        if why:
            say(f"the shipped {name} does not fit this code ({why}): building it here")
            continue
        _install(Layout(root), name, card.version, source)
        taken.append(name)
    return tuple(taken)


def ship(zoo_root: Path, profile: str, names: Sequence[str]) -> Path:
    """Copy ``names`` (their current version: model and card) from a built zoo into the
    shipped models of ``profile`` (``tierlink zoo build --ship``); the shipped root."""
    target = Layout(shipped_root(profile))
    for name in names:
        source = Layout(zoo_root).dir(name)
        version = load_card(source / CARD_FILE).version
        if (target.root / name).exists():
            target.remove(name)
        _install(target, name, version, source)
    return target.root


def _install(layout: Layout, name: str, version: str, source: Path) -> None:
    """A model's file and card from ``source`` as ``name``'s ``version`` in ``layout``."""
    with layout.installing(name, version) as staging:
        for part in (MODEL_FILE, CARD_FILE):
            shutil.copyfile(source / part, staging / part)
