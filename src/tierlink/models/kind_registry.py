"""Output kinds by name. Duplicates are an error; a user's package adds kinds through the
``tierlink.output_kinds`` entry point group (the object, or a zero-argument factory)."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from tierlink.errors import ConfigError
from tierlink.models.kinds import Classification, Embedding, Multilabel, OutputKind, Regression

ENTRY_POINT_GROUP = "tierlink.output_kinds"


class KindRegistry:
    def __init__(self, kinds: tuple[OutputKind, ...] = ()) -> None:
        self._kinds: dict[str, OutputKind] = {}
        self._entry_points_loaded = False
        for kind in kinds:
            self.register(kind)

    def register(self, kind: OutputKind) -> None:
        if kind.name in self._kinds:
            raise ConfigError(f"output kind {kind.name!r} is already registered",
                              hint="pick another name")
        self._kinds[kind.name] = kind

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._kinds)

    def get(self, name: str) -> OutputKind:
        self._load_entry_points()
        kind = self._kinds.get(name)
        if kind is None:
            raise ConfigError(f"unknown output kind {name!r}",
                              hint=f"choose one of {', '.join(self.names())}, or register "
                                   f"one under the {ENTRY_POINT_GROUP!r} entry points")
        return kind

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            loaded: Any = ep.load()
            self.register(loaded() if isinstance(loaded, type) else loaded)


def _builtin() -> tuple[OutputKind, ...]:
    from tierlink.models.detection import Detection

    return (Classification(), Multilabel(), Detection(), Regression(), Embedding())


_REGISTRY: KindRegistry | None = None


def registry() -> KindRegistry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = KindRegistry(_builtin())
    return _REGISTRY


def kind_of(name: str) -> OutputKind:
    return registry().get(name)
