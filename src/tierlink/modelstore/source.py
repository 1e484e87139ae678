"""The local model store as a model source of the catalog (:mod:`tierlink.models.catalog`):
users' imported models by name, and the labelled data they were imported with."""

from __future__ import annotations

from collections.abc import Sequence

from tierlink.models.catalog import Resolved, SourceOptions
from tierlink.models.data import Splits
from tierlink.modelstore.store import ModelStore


class StoreSource:
    """``$TIERLINK_HOME/models``: asked first, so a name a user imported is theirs."""

    name = "store"
    rank = 10

    def __init__(self, options: SourceOptions, store: ModelStore | None = None) -> None:
        self.options = options
        self.store = store or ModelStore.default()

    def offers(self, name: str) -> bool:
        return self.store.has(name)

    def names(self) -> list[str]:
        return self.store.names()

    def resolve(self, names: Sequence[str]) -> dict[str, Resolved]:
        return {n: Resolved(n, *self.store.paths(n), source=self.name) for n in names}

    def data(self, task: str) -> Splits | None:
        """The data the task's first imported model was measured on, split as it was."""
        first = next(iter(self.store.names(task)), None)
        if first is None:
            return None
        return self.store.splits(first)
