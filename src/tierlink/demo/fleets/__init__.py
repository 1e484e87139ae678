"""The demo's fleet files, shipped as package data: ``fleet.yaml`` (the demo's 7-node
fleet, also the default of ``tierlink sim``) and ``chat-fleet.yaml`` (its chat phase)."""

from __future__ import annotations

import atexit
from contextlib import ExitStack
from importlib.resources import as_file, files
from pathlib import Path

FLEET = "fleet.yaml"
CHAT_FLEET = "chat-fleet.yaml"

_copies = ExitStack()  # temporary copies, where the package is not on a file system
atexit.register(_copies.close)


def fleet_path(name: str = FLEET) -> Path:
    """A real path to the demo's fleet file ``name``. Installed (editable or a wheel), the
    package's files are files of their own: that path; from a zip, a temporary copy kept
    until the interpreter exits."""
    resource = files(__name__).joinpath(name)
    if not resource.is_file():
        raise FileNotFoundError(f"the demo has no fleet file {name!r}")
    if isinstance(resource, Path):
        return resource
    return _copies.enter_context(as_file(resource))
