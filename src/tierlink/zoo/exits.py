"""The zoo's early-exit model: a multi-exit Fashion-MNIST net, built into segments a node
can stop after.

The card, the model on disk and the runtime are the framework's
(:mod:`tierlink.models.exit_card`, :mod:`tierlink.models.exit_runner`,
:mod:`tierlink.models.exits`): any multi-exit model with such a card is served the same way.
This module is the zoo's side: it builds one such model, names it, and says when a built one
is stale.

The net is the zoo's ``large`` architecture (``SPECS["large"]``: stages (32,), (64, 64),
(128, 128), flatten head) with BranchyNet-style side classifiers after stage 1 and stage 2,
trained jointly (weighted sum of the three cross-entropies) with the zoo's SGD / one-cycle
recipe. It is exported as three ONNX segments whose boundaries are also split points::

    fmnist-exits-s1.onnx  input (N, 1, 28, 28) -> features1 (N, 32, 14, 14), exit1 (N, 10)
    fmnist-exits-s2.onnx  features1            -> features2 (N, 64, 7, 7),   exit2 (N, 10)
    fmnist-exits-s3.onnx  features2            -> logits (N, 10)
    fmnist-exits.onnx     input -> exit1, exit2, logits (the whole chain, for checking)

with its card (``card.json``, a :class:`~tierlink.models.card.ModelCard` of format
``multi-exit`` whose ``multi_exit`` section has, per exit, its accuracy, a temperature fitted on the calibration split, ECE
before/after and its cascade curve; per segment its latency and MACs; per boundary the
feature shape and bytes; and an operating point (thresholds within 0.5 point of the final
exit on the calibration split). Everything lives in ``<zoo dir>/fmnist-exits/``: a
subdirectory, because the zoo cache reads every ``fmnist-*.json`` beside its models as a
``ModelCard``.

This module is torch-free: the layout constants, the build fingerprint, loading and
staleness. The torch builder (the net, training, export, measuring the card) is
:mod:`tierlink.zoo.exits_build`, imported by :func:`ensure_exits` only when a build is
needed.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from tierlink.core.progress import Reporter, as_reporter
from tierlink.errors import ModelError, ZooError
from tierlink.models.card import ModelCard, file_sha256, load_card
from tierlink.models.exit_runner import Clock, ExitModel
from tierlink.models.layout import CARD_FILE, Layout
from tierlink.zoo.profiles import FMNIST_SPLITS_ID, SPECS, BuildProfile, TrainRecipe, get_profile

EXITS_NAME = "fmnist-exits"
EXITS_VERSION = "1"
TASK = "fmnist"
BASE_VARIANT = "large"
# Joint loss weights of exit1, exit2 and the final head (BranchyNet weighs the early exits
# lower so they do not pull the shared trunk away from the final classifier).
LOSS_WEIGHTS: tuple[float, ...] = (0.3, 0.3, 1.0)
# Side branches (conv width, 2x2 max-pool first): [pool ->] 3x3 conv + BN + ReLU -> 2x2
# max-pool -> flatten -> linear, the conv at 7x7. Exit 1 costs ~0.9M MACs and exit 2 ~1.8M,
# against ~10.8M for the stage after each.
BRANCHES: tuple[tuple[int, bool], ...] = ((64, True), (64, False))
SEGMENT_INPUTS = ("input", "features1", "features2")
SEGMENT_OUTPUTS: tuple[tuple[str, ...], ...] = (
    ("features1", "exit1"), ("features2", "exit2"), ("logits",))
EXIT_NAMES = ("exit1", "exit2", "logits")
# Per profile, a recipe of its own where it differs from the profile's ``large`` one. Full:
# 4 epochs instead of the zoo's 7, because the reference build ran on two cores shared with
# other builds (13 min per epoch at the worst); 7 would match ``fmnist-large`` exactly.
RECIPES: Mapping[str, TrainRecipe] = MappingProxyType({
    "full": TrainRecipe(epochs=4, flips=True)})


def exits_dir(profile: str = "full", root: Path | None = None) -> Path:
    """Where the multi-exit model of ``profile`` lives:
    ``<root or zoo_dir>/fmnist-exits/<EXITS_VERSION>`` (the framework's layout)."""
    from tierlink.zoo.cache import zoo_dir

    return (zoo_dir(profile) if root is None else Path(root)) / EXITS_NAME / EXITS_VERSION


def exits_fingerprint(profile: BuildProfile) -> str:
    """Hash of everything that determines the weights and the measured card: a card with
    another fingerprint is rebuilt. Bump ``EXITS_VERSION`` for code changes."""
    parts = (EXITS_VERSION, SPECS[BASE_VARIANT], BRANCHES, LOSS_WEIGHTS,
             exits_recipe(profile), profile.train_samples, profile.eval_samples, profile.seed,
             FMNIST_SPLITS_ID)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def exits_recipe(profile: BuildProfile) -> TrainRecipe:
    """The training recipe of the multi-exit net in ``profile`` (see ``RECIPES``)."""
    return RECIPES.get(profile.name) or profile.recipe(TASK, BASE_VARIANT)


def load_exits(profile: str = "full", root: Path | None = None) -> ExitModel:
    """The multi-exit model already built for ``profile``; ``ZooError`` saying what is
    missing or stale."""
    build_profile = get_profile(profile)
    directory = exits_dir(profile, root)
    card_path = directory / CARD_FILE
    if not card_path.is_file():
        raise ZooError(f"{EXITS_NAME} is not built in {directory}",
                       hint="build it with tierlink.zoo.exits.ensure_exits()")
    try:
        card = load_card(card_path)
    except ModelError as exc:  # unreadable or malformed: a ZooError, so ensure_exits rebuilds
        raise ZooError(exc.message, hint="rebuild it with ensure_exits(force=True)") from exc
    problem = _stale_reason(card, directory, build_profile)
    if problem:
        raise ZooError(f"{EXITS_NAME} in {directory} is stale: {problem}")
    return ExitModel(directory, card)


def _stale_reason(card: ModelCard, directory: Path, profile: BuildProfile) -> str | None:
    net, training = card.multi_exit, card.training
    if net is None or training is None:
        return "its card is not a trained multi-exit model's"
    if card.version != EXITS_VERSION or training.profile != profile.name:
        return f"it is version {card.version} of profile {training.profile!r}"
    if training.recipe != exits_fingerprint(profile):
        return "it was built with another architecture or recipe"
    files = [(s.file, s.sha256) for s in net.segments] + [
        (net.whole["file"], net.whole["sha256"])]
    for name, sha in files:
        path = directory / name
        if not path.is_file() or file_sha256(path) != sha:
            return f"{name} is missing or does not match the sha256 in its card"
    return None


def ensure_exits(profile: str = "full", root: Path | None = None,
                 progress: bool | Reporter = False, *,
                 force: bool = False, clock: Clock = time.perf_counter) -> ExitModel:
    """The multi-exit model of ``profile``, built first when missing or stale (``full``:
    ~15 minutes of CPU; ``test``: seconds). Holds ``build_lock(root, "fmnist-exits")`` while
    building, so processes that start together build once. ``progress``: the reporter the
    build shows its phase on (``True``: one on stderr)."""
    from tierlink.zoo.cache import build_lock, migrate_flat, zoo_dir

    base = zoo_dir(profile) if root is None else Path(root)
    migrate_flat(base)
    if not force:
        try:
            return load_exits(profile, base)
        except ZooError:
            pass
    base.mkdir(parents=True, exist_ok=True)
    with build_lock(base, EXITS_NAME):
        if not force:
            try:  # another process may have built it while this one waited for the lock
                return load_exits(profile, base)
            except ZooError:
                pass
        from tierlink.zoo.exits_build import build_exits  # torch: only when building

        with Layout(base).installing(EXITS_NAME, EXITS_VERSION) as staging:
            build_exits(get_profile(profile), staging, as_reporter(progress), clock=clock)
    return load_exits(profile, base)
