"""The built zoo on disk: where it lives, whether it is valid, building it once.

Layout: ``<zoo_dir(profile)>/<task>-<variant>.onnx`` with ``<task>-<variant>.json`` (its
card) beside it. A cached zoo is valid when every model's ``.onnx`` and card exist, the
card's ``sha256`` matches the file, and the card was built by this profile, at the current
``MODEL_VERSION``, with the profile's current recipe. Builds hold an exclusive file lock, so
processes that start together (a fleet's nodes) build once: the others wait and then find
the cache valid.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tierlink.errors import ModelNotFound, ZooError
from tierlink.zoo.cards import ModelCard, file_sha256, load_card
from tierlink.zoo.profiles import MODEL_VERSION, get_profile, model_names, recipe_fingerprint

log = logging.getLogger(__name__)


def tierlink_home(env: Mapping[str, str] | None = None) -> Path:
    """``$TIERLINK_HOME``, default ``~/.cache/tierlink`` (read when called, never at import)."""
    env = os.environ if env is None else env
    home = env.get("TIERLINK_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "tierlink"


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
        self.card(name)
        return self.root / f"{name}.onnx"

    def card_path(self, name: str) -> Path:
        """The card (JSON) of model ``name``."""
        self.card(name)
        return self.root / f"{name}.json"

    def card(self, name: str) -> ModelCard:
        card = self.cards.get(name)
        if card is None:
            raise ModelNotFound(f"the {self.task} zoo has no model {name!r}; it has "
                                f"{list(self.cards)}")
        return card


def load_zoo(task: str = "fmnist", profile: str = "full", root: Path | None = None) -> Zoo:
    """The zoo already built at ``root`` (default ``zoo_dir(profile)``), without building.
    Raises ``ZooError`` saying which file is missing or stale."""
    get_profile(profile)
    root = zoo_dir(profile) if root is None else Path(root)
    cards = {name: _valid_card(root, name, task, profile) for name in model_names(task)}
    return Zoo(task, profile, root, MappingProxyType(cards))


def _valid_card(root: Path, name: str, task: str, profile: str) -> ModelCard:
    onnx_path, card_path = root / f"{name}.onnx", root / f"{name}.json"
    if not onnx_path.is_file() or not card_path.is_file():
        raise ZooError(f"zoo model {name} is not built in {root}")
    card = load_card(card_path)
    problem = _stale_reason(card, onnx_path, name, task, profile)
    if problem:
        raise ZooError(f"zoo model {name} in {root} is stale: {problem}")
    return card


def _stale_reason(card: ModelCard, onnx_path: Path, name: str, task: str,
                  profile: str) -> str | None:
    if (card.task, card.name, card.training.profile) != (task, name, profile):
        return f"its card describes {card.name} of the {card.training.profile} profile"
    if name != f"{task}-{card.variant}":
        return f"its card names variant {card.variant!r}"
    if card.version != MODEL_VERSION:
        return f"it is version {card.version}, the zoo now builds version {MODEL_VERSION}"
    if card.training.recipe != recipe_fingerprint(get_profile(profile), card.variant):
        return "it was built with another recipe than the profile's current one"
    if card.sha256 != file_sha256(onnx_path):
        return "the .onnx file does not match the sha256 in its card"
    return None


def ensure_zoo(task: str = "fmnist", profile: str = "full", progress: bool = True,
               force: bool = False, root: Path | None = None) -> Zoo:
    """The zoo of ``task`` / ``profile``, building whatever is missing or stale first (every
    model when ``force``). Cheap when cached: reads the cards and hashes the files.

    Building trains with torch (``full``: minutes; ``test``: under a minute) and shows a
    progress bar per model when ``progress``. Models already valid on disk are kept, so an
    interrupted build resumes. Raises ``ZooError`` if it cannot build.
    """
    build_profile = get_profile(profile)
    names = model_names(task)
    root = zoo_dir(profile) if root is None else Path(root)
    if force or _stale(names, task, profile, root):
        root.mkdir(parents=True, exist_ok=True)
        with _build_lock(root):
            # Another process may have built them while this one waited for the lock.
            todo = names if force else _stale(names, task, profile, root)
            if todo:
                with _reporter(progress) as reporter:
                    _builder()(task, build_profile, root, reporter, names=todo)
    return load_zoo(task, profile, root)


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


def _reporter(progress: bool) -> Any:
    from tierlink.zoo.progress import NullReporter, RichReporter

    return RichReporter() if progress else nullcontext(NullReporter())


@contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    import fcntl

    try:
        handle = (root / ".build.lock").open("a+b")
    except OSError as exc:
        raise ZooError(f"cannot create the zoo's lock file in {root}: {exc}",
                       hint="set TIERLINK_HOME to a writable directory") from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield
