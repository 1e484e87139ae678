"""Files that survive a kill -9 or a power loss: fsync and atomic replacement.

The model slots, the node's model bookkeeping and the repository's blobs all rely on the
same two rules: data is fsynced before it is named, and a name is switched with
``os.replace`` followed by an fsync of the directory that holds it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from tierlink.errors import ModelError


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a created, renamed or removed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (the name itself is not yet durable)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_synced(path: Path, data: bytes) -> None:
    """Atomically replace ``path``: a tmp file in the same directory, fsync, rename, fsync
    the directory. Readers see the old bytes or the new ones, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path, what: str) -> Any:
    """The JSON at ``path``; ``ModelError`` naming ``what`` when it is missing or malformed."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {what} {path}: {exc}") from exc


def write_json(path: Path, data: Any, what: str) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically (temp file, then rename; not
    fsynced: cards and profiles can be made again); ``ModelError`` naming ``what`` when the
    disk refuses. The temp file's name is this writer's own, so processes writing the same
    file at once (nodes measuring one model's card) each replace it whole."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"cannot write {what} {path}: {exc}") from exc
