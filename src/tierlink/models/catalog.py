"""The catalog: where every model name a command, benchmark, the simulator or a fleet's
nodes use is resolved, from registered sources.

A *source* offers models by name and labelled data by task. The built-in sources (declared
under the ``tierlink.model_sources`` entry-point group in tierlink's ``pyproject.toml``) are
the local model store (users' imported models: ``tierlink model import``), the demo's
zoo (built from real data on first use) and the signed repository (``name@version``,
installed and verified on first use); a user's package adds its own there — a factory
taking :class:`SourceOptions` and returning a :class:`ModelSource`. Sources are asked in
their ``rank`` order (the store first: a name a user imported is theirs)::

    catalog = Catalog.default(SourceOptions(profile="test"))
    found = catalog.resolve(["fmnist-small", "spam-small"])   # builds what it must
    onnx, card = found["fmnist-small"].file, found["fmnist-small"].card
    splits = catalog.data("fmnist")                           # calib / test parts

Nothing here knows any particular source; the zoo is one among others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tierlink.core.progress import Reporter
from tierlink.core.registry import Registry
from tierlink.errors import ModelNotFound
from tierlink.models.data import Splits

ENTRY_POINT_GROUP = "tierlink.model_sources"


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What a source may need to know of the caller: the zoo's build ``profile`` (a fleet
    file's ``zoo.profile``), whether and where to show progress while building (a
    :class:`~tierlink.core.progress.Reporter`; ``True``: one on stderr), where to say what
    it is doing; the signed repository's URL, the publisher keys to trust, the token to read
    it with and how to verify its TLS certificate (``True``: the system's trust, or an
    ``ssl.SSLContext``)."""

    profile: str = "full"
    progress: bool | Reporter = True
    say: Callable[[str], None] = field(default=_quiet)
    repository: str | None = None
    trusted_keys: tuple[str, ...] = ()
    token: str | None = None
    verify: Any = True


@dataclass(frozen=True, slots=True)
class Resolved:
    """A model found: its file (an ONNX graph, a Python model's package, a multi-exit
    model's whole graph), its card, and the source it came from."""

    name: str
    file: Path
    card: Path
    source: str


class ModelSource(Protocol):
    """Models by name and labelled data by task, from one place."""

    name: str
    rank: int  # sources are asked in increasing rank

    def offers(self, name: str) -> bool:
        """Whether the source has (or can make) model ``name``; cheap, builds nothing."""
        ...

    def resolve(self, names: Sequence[str]) -> dict[str, Resolved]:
        """Each of ``names`` (all offered), made first if it must be."""
        ...

    def names(self) -> list[str]:
        """The models the source offers now (for listings and error hints)."""
        ...

    def data(self, task: str) -> Splits | None:
        """Labelled data of ``task`` (calibration and test parts), None without any."""
        ...


SourceFactory = Callable[[SourceOptions], ModelSource]


def source_registry() -> Registry[SourceFactory]:
    """The registered source factories (entry points read on first use)."""
    return Registry(ENTRY_POINT_GROUP, "model source")


class Catalog:
    """Model names resolved over ``sources`` (asked in rank order)."""

    def __init__(self, sources: Iterable[ModelSource]) -> None:
        self.sources = tuple(sorted(sources, key=lambda s: s.rank))

    @classmethod
    def default(cls, options: SourceOptions | None = None) -> Catalog:
        """Every registered source, made with ``options``."""
        registry = source_registry()
        options = options or SourceOptions()
        return cls(registry.get(name)(options) for name in registry.names())

    def source_of(self, name: str) -> ModelSource:
        for source in self.sources:
            if source.offers(name):
                return source
        offered = {s.name: s.names() for s in self.sources}
        raise ModelNotFound(
            f"no model {name!r} in the catalog",
            hint="known: " + "; ".join(f"{s}: {', '.join(n[:12]) or '-'}"
                                       for s, n in offered.items())
                 + ". Import your own with `tierlink model import NAME MODEL`")

    def resolve(self, names: Iterable[str]) -> dict[str, Resolved]:
        """Every name in ``names`` found (made where a source makes it); ``ModelNotFound``
        naming the first unknown one and what the sources offer."""
        wanted = list(dict.fromkeys(names))
        by_source: dict[str, list[str]] = {}
        sources = {}
        for name in wanted:
            source = self.source_of(name)
            sources[source.name] = source
            by_source.setdefault(source.name, []).append(name)
        found: dict[str, Resolved] = {}
        for source_name, names_here in by_source.items():
            found.update(sources[source_name].resolve(names_here))
        return {name: found[name] for name in wanted}

    def paths(self, names: Iterable[str]) -> dict[str, tuple[Path, Path]]:
        """Name -> (model file, card): what a fleet's node specs name."""
        return {n: (r.file, r.card) for n, r in self.resolve(names).items()}

    def data(self, task: str) -> Splits:
        """Labelled data of ``task`` from the first source that has some."""
        for source in self.sources:
            splits = source.data(task)
            if splits is not None:
                return splits
        raise ModelNotFound(f"no source has labelled data of task {task!r}",
                            hint="sources: " + ", ".join(s.name for s in self.sources))

    def describe(self) -> Mapping[str, Any]:
        """Per source, the models it offers (``tierlink models`` prints it)."""
        return {s.name: s.names() for s in self.sources}
