"""One on-disk layout for a model's versions: ``<root>/<name>/<version>/``.

Each version's directory holds the model's file(s) — ``model.onnx``, a Python model's
``model.zip``, ... — and its ``card.json`` (and what is measured beside a card, e.g. its
split profile). ``<root>/<name>/CURRENT`` names the version a name resolves to (the one
installed last)::

    <root>/spam-small/1/model.onnx
    <root>/spam-small/1/card.json
    <root>/spam-small/2/model.zip
    <root>/spam-small/2/card.json
    <root>/spam-small/CURRENT          "2"

A version is written into a staging directory and renamed into place (:meth:`installing`):
a failed install leaves nothing behind, and re-installing a version replaces it only once
the new one is whole. A directory written before versions existed (``<root>/<name>/card.json``
directly) is migrated on first use (:meth:`migrate`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tierlink.durable import fsync_dir, replace_synced
from tierlink.errors import ModelError

CARD_FILE = "card.json"
MODEL_FILE = "model.onnx"  # a version's one ONNX graph
CURRENT = "CURRENT"

log = logging.getLogger(__name__)


def check_part(kind: str, value: str) -> None:
    """A name or version that is one path part and not a hidden one."""
    if (not value or value.startswith(".") or value in (CURRENT, "tasks", "data")
            or any(c in value for c in "/\\ \t\n")):
        raise ModelError(f"model {kind} {value!r} is not usable",
                         hint="letters, digits, '-', '_' and '.'; e.g. spam-small, 2")


class Layout:
    """The versions of every model under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and self.current(p.name))

    def versions(self, name: str) -> list[str]:
        base = self.root / name
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and (p / CARD_FILE).is_file())

    def current(self, name: str) -> str | None:
        """The version ``name`` resolves to; None when it has none."""
        try:
            version = (self.root / name / CURRENT).read_text().strip()
        except OSError:
            return None
        return version if (self.root / name / version / CARD_FILE).is_file() else None

    def dir(self, name: str, version: str | None = None) -> Path:
        """A version's directory (the current one by default); ``ModelError`` when absent."""
        version = version or self.current(name)
        if version is None or not (self.root / name / version / CARD_FILE).is_file():
            raise ModelError(f"no version {version or '(current)'} of {name!r} in {self.root}")
        return self.root / name / version

    @contextmanager
    def installing(self, name: str, version: str) -> Iterator[Path]:
        """A staging directory that becomes ``<name>/<version>/`` (and the current version)
        when the block ends without error; removed, with nothing installed, when it raises."""
        check_part("name", name)
        check_part("version", version)
        base = self.root / name
        base.mkdir(parents=True, exist_ok=True)
        staging = base / f".staging-{version}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            yield staging
            _swap(staging, base / version)
            replace_synced(base / CURRENT, version.encode())
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if not any(base.iterdir()):  # a first install that failed: nothing at all
                base.rmdir()

    def remove(self, name: str) -> None:
        shutil.rmtree(self.root / name)

    def migrate(self) -> list[str]:
        """Move every ``<name>/`` written before versions (its card directly inside) into
        ``<name>/<its card's version>/``; the names moved (each said in the log)."""
        moved: list[str] = []
        if not self.root.is_dir():
            return moved
        for card in sorted(self.root.glob(f"*/{CARD_FILE}")):
            name = card.parent.name
            if not name.startswith("."):
                self.adopt(name, CARD_FILE)
                moved.append(name)
        return moved

    def adopt(self, name: str, card_name: str) -> Path:
        """Move ``<name>/``, a model's files written before versions with its card as
        ``card_name``, whole into ``<name>/<its card's version>/`` (the card renamed
        ``card.json``) and make that version current; said in the log."""
        base = self.root / name
        version = card_version(base / card_name)
        aside = self.root / f".migrating-{name}-{uuid.uuid4().hex[:8]}"
        os.replace(base, aside)  # the old directory whole, then under its new name
        base.mkdir()
        os.replace(aside, base / version)
        os.replace(base / version / card_name, base / version / CARD_FILE)
        self.set_current(name, version)
        log.warning("moved %s into %s (one directory per version, since tierlink 0.2)",
                    name, base / version)
        return base / version

    def set_current(self, name: str, version: str) -> None:
        """Make ``version`` the one ``name`` means (atomically)."""
        replace_synced(self.root / name / CURRENT, version.encode())
        fsync_dir(self.root)


def card_version(card: Path) -> str:
    """The version a card states, or "1" where it states none usable (an old card)."""
    try:
        version = str(json.loads(card.read_text()).get("version", "1"))
        check_part("version", version)
    except (OSError, ValueError, AttributeError, ModelError):
        return "1"
    return version


def _swap(staging: Path, final: Path) -> None:
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    os.replace(staging, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
