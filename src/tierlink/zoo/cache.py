"""The built zoo on disk: where it lives, whether it is valid, building it once.

Layout: each profile is a root of its own, ``<zoo_dir(profile)>``, in the framework's one
model layout (:mod:`tierlink.models.layout`): ``<root>/<task>-<variant>/<version>/`` holds
``model.onnx`` and ``card.json``; derived variants (``fmnist-small-fp16``) sit beside their
parents the same way. A cached zoo is valid when every model's graph and card exist, the
card's ``sha256`` matches the file, and the card was built by this profile, at the current
``MODEL_VERSION``, with the profile's current recipe. A zoo written before versions (flat
``<name>.onnx`` + ``<name>.json`` files) is moved into the layout on first use. Builds hold an exclusive file lock, so
processes that start together (a fleet's nodes) build once: the others wait and then find
the cache valid.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tierlink.core.progress import Reporter, as_reporter
from tierlink.errors import ModelError, ModelNotFound, ZooError
from tierlink.models.card import LATENCY_KEYS, ModelCard, file_sha256, load_card, save_card
from tierlink.models.home import tierlink_home
from tierlink.models.layout import CARD_FILE, MODEL_FILE, Layout, card_version
from tierlink.zoo import shipped
from tierlink.zoo.profiles import MODEL_VERSION, get_profile, model_names, recipe_fingerprint

log = logging.getLogger(__name__)


def zoo_dir(profile: str = "full") -> Path:
    """Where the zoo of ``profile`` lives: ``$TIERLINK_HOME/zoo/<profile>``."""
    get_profile(profile)  # a clear error for an unknown profile
    return tierlink_home() / "zoo" / profile


@dataclass(frozen=True, slots=True)
class Zoo:
    """A valid built zoo: the models of one task and profile, by name (smallest first)."""

    task: str
    profile: str
    root: Path
    cards: Mapping[str, ModelCard]

    def path(self, name: str) -> Path:
        """The ``.onnx`` file of model ``name``."""
        return self.dir(name) / MODEL_FILE

    def card_path(self, name: str) -> Path:
        """The card (JSON) of model ``name``."""
        return self.dir(name) / CARD_FILE

    def dir(self, name: str) -> Path:
        """The directory of model ``name``'s version."""
        return self.root / name / self.card(name).version

    def card(self, name: str) -> ModelCard:
        card = self.cards.get(name)
        if card is None:
            raise ModelNotFound(f"the {self.task} zoo has no model {name!r}; it has "
                                f"{list(self.cards)}",
                                hint="quantized variants are made with `tierlink quantize`")
        return card

    def base_names(self) -> tuple[str, ...]:
        """The trained full-precision models (``fmnist-small`` ...), smallest first."""
        return tuple(n for n, c in self.cards.items() if c.lineage is None)

    def variants(self, parent: str) -> tuple[str, ...]:
        """The derived variants (quantized, mixed precision) of ``parent`` on disk."""
        return tuple(n for n, c in self.cards.items()
                     if c.lineage is not None and c.lineage.parent == parent)


def load_zoo(task: str = "fmnist", profile: str = "full", root: Path | None = None) -> Zoo:
    """The zoo already built at ``root`` (default ``zoo_dir(profile)``), without building.
    Raises ``ZooError`` saying which file is missing or stale."""
    get_profile(profile)
    root = zoo_dir(profile) if root is None else Path(root)
    migrate_flat(root)
    cards = {name: _valid_card(root, name, task, profile) for name in model_names(task)}
    cards.update(_valid_variants(root, task, cards))
    return Zoo(task, profile, root, MappingProxyType(cards))


def _valid_variants(root: Path, task: str, bases: Mapping[str, ModelCard]) -> dict[str, ModelCard]:
    """Derived variants in ``root`` whose parent is one of ``bases`` as it is now; a variant
    made from an older build of its parent is stale and left out (remake it)."""
    found = {}
    layout = Layout(root)
    for name in layout.names():
        if name in bases or not name.startswith(f"{task}-"):
            continue
        directory = layout.dir(name)
        try:
            card = load_card(directory / CARD_FILE)
        except ModelError as exc:
            log.warning("ignoring zoo variant %s: %s", name, exc.message)
            continue
        problem = _variant_problem(card, directory / MODEL_FILE, bases)
        if problem:
            log.info("ignoring zoo variant %s: %s", name, problem)
            continue
        found[name] = card
    return found


def _variant_problem(card: ModelCard, onnx_path: Path,
                     bases: Mapping[str, ModelCard]) -> str | None:
    lineage = card.lineage
    if lineage is None or lineage.parent not in bases:
        return "it names no parent model in this zoo"
    if lineage.parent_sha256 != bases[lineage.parent].sha256:
        return f"it was made from an older build of {lineage.parent}"
    if _recipe(card) != _recipe(bases[lineage.parent]):
        return f"it was measured with another recipe or data split than {lineage.parent}"
    if not onnx_path.is_file() or card.sha256 != file_sha256(onnx_path):
        return "its .onnx file is missing or does not match the sha256 in its card"
    return None


def _valid_card(root: Path, name: str, task: str, profile: str) -> ModelCard:
    directory = root / name / MODEL_VERSION
    onnx_path, card_path = directory / MODEL_FILE, directory / CARD_FILE
    if not onnx_path.is_file() or not card_path.is_file():
        raise ZooError(f"zoo model {name} is not built in {root}")
    card = load_card(card_path)
    problem = _stale_reason(card, onnx_path, name, task, profile)
    if problem:
        raise ZooError(f"zoo model {name} in {root} is stale: {problem}")
    return card


def _recipe(card: ModelCard) -> str:
    return card.training.recipe if card.training else ""


def _stale_reason(card: ModelCard, onnx_path: Path, name: str, task: str,
                  profile: str) -> str | None:
    built = card.training.profile if card.training else "(not a trained model's)"
    if (card.task, card.name, built) != (task, name, profile):
        return f"its card describes {card.name} of the {built} profile"
    if name != f"{task}-{card.variant}":
        return f"its card names variant {card.variant!r}"
    if card.version != MODEL_VERSION:
        return f"it is version {card.version}, the zoo now builds version {MODEL_VERSION}"
    if _recipe(card) != recipe_fingerprint(get_profile(profile), card.variant, task):
        return "it was built with another recipe than the profile's current one"
    if set(card.latency_ms) != set(LATENCY_KEYS):
        return f"its card's latency_ms lacks some of {LATENCY_KEYS}"
    if card.sha256 != file_sha256(onnx_path):
        return "the .onnx file does not match the sha256 in its card"
    return None


def ensure_zoo(task: str = "fmnist", profile: str = "full", progress: bool | Reporter = True,
               force: bool = False, root: Path | None = None) -> Zoo:
    """The zoo of ``task`` / ``profile``, building whatever is missing or stale first (every
    model when ``force``). Cheap when cached: reads the cards and hashes the files.

    Building trains with torch (``full``: minutes; ``test``: under a minute) and shows a
    phase per model on ``progress`` (a :class:`~tierlink.core.progress.Reporter`; ``True``: one
    on stderr, ``False``: none). Models already valid on disk are kept, so an
    interrupted build resumes. Raises ``ZooError`` if it cannot build.
    """
    build_profile = get_profile(profile)
    names = model_names(task)
    from_shipped = root is None and not force  # the default zoo starts from the shipped one
    root = zoo_dir(profile) if root is None else Path(root)
    migrate_flat(root)
    reporter = as_reporter(progress)
    if force or _stale(names, task, profile, root):
        root.mkdir(parents=True, exist_ok=True)
        with build_lock(root, task):
            # Another process may have built them while this one waited for the lock.
            todo = names if force else _stale(names, task, profile, root)
            if todo and from_shipped:
                taken = shipped.take(root, profile, todo, lambda name, card, onnx:
                                     _stale_reason(card, onnx, name, task, profile),
                                     reporter.say)
                todo = tuple(n for n in todo if n not in taken)
            if todo:
                _builder()(task, build_profile, root, reporter, names=todo)
    zoo = load_zoo(task, profile, root)
    if from_shipped:
        zoo = _shipped_variants(zoo, reporter)
    if any(card.calibration is None for card in zoo.cards.values()):
        with build_lock(root, task):
            _calibrate_missing(load_zoo(task, profile, root), build_profile.eval_samples)
        zoo = load_zoo(task, profile, root)
    return zoo


def _shipped_variants(zoo: Zoo, reporter: Reporter) -> Zoo:
    """The shipped variants of ``zoo``'s models it lacks (the devices' FP16 copy), taken
    where they were made from these very models; the zoo as it is then."""
    wanted = [n for n in shipped.shipped_names(zoo.profile)
              if n.startswith(f"{zoo.task}-") and n not in zoo.cards]
    if not wanted:
        return zoo
    bases = {n: zoo.cards[n] for n in zoo.base_names()}

    def problem(_name: str, card: ModelCard, onnx_path: Path) -> str | None:
        return _variant_problem(card, onnx_path, bases)

    with build_lock(zoo.root, zoo.task):
        shipped.take(zoo.root, zoo.profile, wanted, problem, reporter.say)
    return load_zoo(zoo.task, zoo.profile, zoo.root)


def _calibrate_missing(zoo: Zoo, eval_samples: int | None) -> None:
    """Fit the temperature of every card built before calibration existed (seconds)."""
    from tierlink.models.calibration import calibrated_card
    from tierlink.models.evaluate import onnx_logits
    from tierlink.zoo.datasets import load_splits

    splits = load_splits(zoo.task)
    calib = splits.calib.head(eval_samples or len(splits.calib))
    test = splits.test.head(eval_samples or len(splits.test))
    for name, card in zoo.cards.items():
        if card.calibration is not None:
            continue
        log.info("calibrating %s (temperature scaling on the calibration split)", name)
        path = zoo.path(name)
        updated = calibrated_card(card, onnx_logits(path, calib.input), calib.labels,
                                  onnx_logits(path, test.input), test.labels)
        save_card(updated, zoo.card_path(name))


def _stale(names: tuple[str, ...], task: str, profile: str, root: Path) -> tuple[str, ...]:
    """The models among ``names`` that are missing or stale in ``root``."""
    stale = []
    for name in names:
        try:
            _valid_card(root, name, task, profile)
        except ZooError as exc:
            log.info("%s (re)building it", exc.message)
            stale.append(name)
    return tuple(stale)


def _builder() -> Any:
    try:
        from tierlink.zoo import build  # torch: imported only when a build is needed
    except ImportError as exc:
        raise ZooError(f"building the zoo needs torch, which does not import: {exc}",
                       hint="pip install 'tierlink[zoo]' (torch==2.13.0, the CPU wheel)") from exc
    return build.build_zoo


@contextmanager
def build_lock(root: Path, task: str = "") -> Iterator[None]:
    import fcntl

    try:
        # One lock per task: building MNIST does not hold up quantizing Fashion-MNIST.
        handle = (root / f".build{'-' + task if task else ''}.lock").open("a+b")
    except OSError as exc:
        raise ZooError(f"cannot create the zoo's lock file in {root}: {exc}",
                       hint="set TIERLINK_HOME to a writable directory") from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


def migrate_flat(root: Path) -> None:
    """Move a zoo written before versions into the layout: each ``<name>.onnx`` +
    ``<name>.json`` (+ ``<name>.splits.json``) into ``<name>/<its card's version>/`` as
    ``model.onnx``, ``card.json`` (+ ``card.splits.json``), and a model kept as a directory
    (the multi-exit net's ``fmnist-exits/``) into ``<name>/<version>/``; each move is said in
    the log."""
    if not root.is_dir():
        return
    layout = Layout(root)
    for card in sorted(root.glob("*.json")):
        graph = card.with_suffix(".onnx")
        if card.name.endswith(".splits.json") or not graph.is_file():
            continue
        target = root / card.stem / card_version(card)
        target.mkdir(parents=True, exist_ok=True)
        splits = card.with_name(card.stem + ".splits.json")
        if splits.is_file():
            os.replace(splits, target / "card.splits.json")
        os.replace(graph, target / MODEL_FILE)
        os.replace(card, target / CARD_FILE)
        layout.set_current(card.stem, target.name)
        log.warning("zoo: moved %s into %s (one directory per version, since tierlink 0.2)",
                    card.stem, target)
    for card in sorted(root.glob("*/*.json")):  # a model kept as a directory of files
        if card.stem == card.parent.name and not card.stem.startswith("."):
            layout.adopt(card.stem, card.name)
