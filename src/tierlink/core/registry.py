"""One registry mechanism for every pluggable family: policies, output kinds, runtimes.

A :class:`Registry` maps names to entries of one family. Its entries come from one
entry-point group (``tierlink.policies``, ``tierlink.output_kinds``, ``tierlink.runtimes``):
tierlink's own built-ins are declared there in its ``pyproject.toml`` exactly as a user's
package declares its own, so there is one way in. Entry points are listed on first use, never
at import, and each is loaded only when its name is asked for (a node serving ONNX models
never imports the language-model runtime, nor torch with it). Two different entries under one
name are an error, never a silent overwrite; the same object declared twice (an entry point
and an explicit ``register`` of it) is one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any, Generic, TypeVar

from tierlink.errors import ConfigError

T = TypeVar("T")


def _as_is(loaded: Any) -> Any:
    return loaded


class Registry(Generic[T]):
    """Name -> entry of one family (``what``, e.g. "policy"), read from ``group``.

    ``adapt`` turns what an entry point loads into an entry (e.g. instantiates a class);
    ``discover=False`` leaves the entry points unread (a registry a test fills by hand).
    """

    def __init__(self, group: str, what: str, *, adapt: Callable[[Any], T] = _as_is,
                 discover: bool = True) -> None:
        self.group, self.what = group, what
        self._adapt = adapt
        self._entries: dict[str, T] = {}
        self._origin: dict[str, Any] = {}
        self._pending: dict[str, Any] = {}  # name -> entry point not loaded yet
        self._discovered = not discover

    def register(self, name: str, entry: T, *, origin: Any = None) -> None:
        """Add ``entry`` as ``name``; ``ConfigError`` when another entry has the name (the
        entry points are read first, so a name they hold is taken)."""
        self._discover()
        origin = entry if origin is None else origin
        if name in self._pending:
            self._load(name)
        if name in self._entries:
            if self._origin[name] is origin:
                return
            raise ConfigError(f"{self.what} {name!r} is already registered",
                              hint="pick another name")
        self._entries[name] = entry
        self._origin[name] = origin

    def names(self) -> list[str]:
        self._discover()
        return sorted({*self._entries, *self._pending})

    def get(self, name: str) -> T:
        """The entry named ``name``; ``ConfigError`` listing the known names otherwise."""
        self._discover()
        if name in self._pending:
            self._load(name)
        entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(f"unknown {self.what} {name!r}",
                              hint=f"choose one of {', '.join(self.names())}, or register "
                                   f"one under the {self.group!r} entry points")
        return entry

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for ep in metadata.entry_points(group=self.group):
            first = self._pending.get(ep.name)
            if first is not None and first.value != ep.value:
                raise ConfigError(f"{self.what} {ep.name!r} is already registered (entry "
                                  f"points {first.value} and {ep.value})",
                                  hint="uninstall one of the packages, or rename its entry")
            self._pending[ep.name] = ep

    def _load(self, name: str) -> None:
        loaded = self._pending.pop(name).load()
        self.register(name, self._adapt(loaded), origin=loaded)
