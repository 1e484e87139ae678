"""The models a command runs, by name, through the catalog (:mod:`tierlink.models.catalog`):
users' own from the local model store, the zoo's (built, variants made, on first use), the
photo model, the early-exit net — whatever a registered source offers."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.console import Console

console = Console(stderr=True)


def fleet_models(profile: str, wanted: Iterable[str], progress: bool = True
                 ) -> dict[str, tuple[Path, Path]]:
    """Model name -> (model file, card) for every name in ``wanted``, made first where a
    source makes it (``profile``: the zoo's build profile, a fleet file's ``zoo.profile``)."""
    from tierlink.models.catalog import Catalog, SourceOptions

    options = SourceOptions(profile=profile, progress=progress,
                            say=lambda m: console.print(f"[dim]{m}[/dim]"))
    return Catalog.default(options).paths(wanted)
