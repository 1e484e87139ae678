"""A model of several files travelling as one: ``model.zip``.

A version in the repository, a node's slot or the model store carries one file; a model
made of more — a Python model's source and weights, a multi-exit model's segments — is
zipped into one (:func:`pack`: sorted names, fixed timestamps, so the same files give the
same bytes and sha256) and extracted once, beside the zip, where it is served
(:func:`unpack`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
import zipfile
from collections.abc import Iterable
from pathlib import Path

from tierlink.errors import ModelError

PACKAGE = "model.zip"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest timestamp: the same files, the same bytes


def pack(files: Iterable[tuple[Path, str]], dest: Path) -> None:
    """Zip ``files`` (each a path and its name inside the package) into ``dest``."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, name in sorted(files, key=lambda f: f[1]):
            info = zipfile.ZipInfo(name, _EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, Path(path).read_bytes(), zipfile.ZIP_DEFLATED)


def is_package(path: Path) -> bool:
    return Path(path).is_file() and zipfile.is_zipfile(path)


def unpack(package: Path) -> Path:
    """The package's files, extracted once into ``.unpacked-<sha>`` beside it (atomically:
    a process that loses the race uses the winner's copy)."""
    package = Path(package)
    digest = hashlib.sha256(package.read_bytes()).hexdigest()[:16]
    target = package.parent / f".unpacked-{digest}"
    if target.is_dir():
        return target
    staging = package.parent / f".unpacked-{digest}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with zipfile.ZipFile(package) as zf:
            for name in zf.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise ModelError(f"{package} holds an unsafe path {name!r}")
            zf.extractall(staging)
        os.replace(staging, target)
    except (OSError, zipfile.BadZipFile) as exc:
        if target.is_dir():  # another process unpacked it first
            return target
        raise ModelError(f"cannot unpack the model package {package}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
