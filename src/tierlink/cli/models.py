"""The models a command runs, by name, through the catalog (:mod:`tierlink.models.catalog`):
users' own from the local model store, the zoo's (built, variants made, on first use), the
photo model, the early-exit net — whatever a registered source offers."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tierlink.core.progress import Reporter, as_reporter


def fleet_models(profile: str, wanted: Iterable[str], progress: bool | Reporter = True
                 ) -> dict[str, tuple[Path, Path]]:
    """Model name -> (model file, card) for every name in ``wanted``, made first where a
    source makes it (``profile``: the zoo's build profile, a fleet file's ``zoo.profile``),
    its phases shown on ``progress`` (a reporter; ``True``: one on stderr). What the
    sources say goes to stderr either way."""
    from tierlink.models.catalog import Catalog, SourceOptions

    reporter = as_reporter(progress)
    options = SourceOptions(profile=profile, progress=reporter,
                            say=(reporter if reporter.enabled else Reporter()).say)
    return Catalog.default(options).paths(wanted)
