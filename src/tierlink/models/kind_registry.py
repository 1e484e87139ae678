"""Output kinds by name, through the one registry mechanism (:mod:`tierlink.core.registry`).

The built-in kinds (classification, multilabel, detection, regression, embedding) are
declared under the ``tierlink.output_kinds`` entry-point group in tierlink's
``pyproject.toml``; a user's package adds its own there (the object, or a zero-argument
class). Duplicates are an error.
"""

from __future__ import annotations

from typing import Any

from tierlink.core.registry import Registry
from tierlink.models.kinds import OutputKind

ENTRY_POINT_GROUP = "tierlink.output_kinds"


def _instance(loaded: Any) -> OutputKind:
    return loaded() if isinstance(loaded, type) else loaded  # type: ignore[no-any-return]


class KindRegistry:
    """Output kinds by their name; ``discover=False``: only those registered by hand."""

    def __init__(self, kinds: tuple[OutputKind, ...] = (), *, discover: bool = True) -> None:
        self._kinds: Registry[OutputKind] = Registry(ENTRY_POINT_GROUP, "output kind",
                                                     adapt=_instance, discover=discover)
        for kind in kinds:
            self.register(kind)

    def register(self, kind: OutputKind) -> None:
        self._kinds.register(kind.name, kind)

    def names(self) -> list[str]:
        return self._kinds.names()

    def get(self, name: str) -> OutputKind:
        return self._kinds.get(name)


_REGISTRY: KindRegistry | None = None


def registry() -> KindRegistry:
    """The process-wide registry (built on first use)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = KindRegistry()
    return _REGISTRY


def kind_of(name: str) -> OutputKind:
    return registry().get(name)
