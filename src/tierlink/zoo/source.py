"""The zoo as a model source of the catalog (:mod:`tierlink.models.catalog`).

It offers the zoo's families — ``<task>-small|medium|large`` of each task (Fashion-MNIST,
MNIST), their quantized variants (``fmnist-small-fp16``, made on first use), the
multi-exit net (``fmnist-exits``), the ImageNet photo model — and the labelled data of its
tasks. Everything is built from real data on first use (minutes for the ``full``
profile; the ``test`` profile builds in seconds) and cached under ``$TIERLINK_HOME/zoo``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tierlink.errors import ModelNotFound
from tierlink.models.catalog import Resolved, SourceOptions
from tierlink.models.data import Splits
from tierlink.zoo.exits import EXITS_NAME
from tierlink.zoo.mobilenet import MODEL_NAME as PHOTO_MODEL
from tierlink.zoo.profiles import TASKS, model_names


class ZooSource:
    """The demo's model zoo, built with ``options.profile``."""

    name = "zoo"
    rank = 20

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def offers(self, name: str) -> bool:
        if name in (EXITS_NAME, PHOTO_MODEL):
            return True
        task = _task_of(name)
        if task is None:
            return False
        if name in model_names(task):
            return True
        from tierlink.quantize.variants import split_variant_name

        try:
            split_variant_name(name, model_names(task))
        except ModelNotFound:
            return False
        return True

    def names(self) -> list[str]:
        return [n for t in TASKS for n in model_names(t)] + [EXITS_NAME, PHOTO_MODEL]

    def resolve(self, names: Sequence[str]) -> dict[str, Resolved]:
        """Each name built (and quantized, profiled) where it is missing or stale."""
        found: dict[str, Path | tuple[Path, Path]] = {}
        for task in sorted({t for n in names if (t := _task_of(n)) is not None
                            and n != EXITS_NAME}):
            found |= self._family(task, [n for n in names if _task_of(n) == task
                                         and n != EXITS_NAME])
        if PHOTO_MODEL in names:
            from tierlink.zoo.photo_models import photo_models

            found |= photo_models((PHOTO_MODEL,), say=self.options.say,
                                  progress=self.options.progress)
        if EXITS_NAME in names:  # the multi-exit net: trained on first use
            from tierlink.zoo.exits import ensure_exits

            built = ensure_exits(self.options.profile, progress=self.options.progress)
            found[EXITS_NAME] = (built.whole_path, built.card_path)
        return {n: Resolved(n, *found[n], source=self.name)  # type: ignore[misc]
                for n in names}

    def data(self, task: str) -> Splits | None:
        if task not in TASKS:
            return None
        from tierlink.zoo.datasets import load_splits

        return load_splits(task)

    def _family(self, task: str, names: list[str]) -> dict[str, tuple[Path, Path]]:
        from tierlink.zoo.cache import ensure_zoo
        from tierlink.zoo.variants import with_variants

        zoo = with_variants(ensure_zoo(task=task, profile=self.options.profile,
                                       progress=self.options.progress),
                            names, say=self.options.say, progress=self.options.progress)
        return {n: (zoo.path(n), zoo.card_path(n)) for n in names}


def _task_of(name: str) -> str | None:
    task = name.split("-", 1)[0]
    return task if task in TASKS and "-" in name else None
