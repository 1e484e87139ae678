"""Where the control plane keeps published model versions: one SQLite table.

``model_versions`` holds one row per ``(name, version)``, ever: a version is immutable once
published. Publishing the identical signed manifest again is a no-op (a retried publish);
anything else under the same ``(name, version)`` is a :class:`VersionConflict` (409) —
publish a new version instead.

The table may live in the control plane's registry database (its own connection, WAL, like
:class:`tierlink.control.store.SqliteHardExampleStore`). It is created with
``CREATE TABLE IF NOT EXISTS`` and this module never touches other tables or
``PRAGMA user_version`` (the registry store owns the file's schema version). Thread-safe:
one connection serialised by a lock. Time is never read here: ``add`` takes ``now``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from tierlink.errors import RepositoryError, VersionConflict
from tierlink.repo.manifest import PublishedVersion, SignedManifest, VersionManifest
from tierlink.sqlite_store import mapped_errors, open_store

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS model_versions (
    name         TEXT NOT NULL,
    version      TEXT NOT NULL,
    task         TEXT NOT NULL,
    manifest     TEXT NOT NULL,   -- the manifest's canonical JSON (the signed bytes)
    key_id       TEXT NOT NULL,
    signature    TEXT NOT NULL,   -- base64 ed25519 over `manifest`
    public_key   TEXT NOT NULL,   -- the signer's key as the manifest carried it
    published_at REAL NOT NULL,
    PRIMARY KEY (name, version)
)
""",
    "CREATE INDEX IF NOT EXISTS model_versions_by_time ON model_versions (name, published_at)",
)
_COLUMNS = "manifest, key_id, signature, public_key, published_at"
_ORDER = "ORDER BY name, published_at, rowid"


class VersionStore(Protocol):
    """Published versions: :class:`SqliteVersionStore`, or
    :class:`~tierlink.repo.etcd_store.EtcdVersionStore` for replicas that share them."""

    def add(self, signed: SignedManifest, now: float) -> bool: ...

    def get(self, name: str, version: str) -> PublishedVersion: ...

    def entries(self, name: str | None = None) -> list[PublishedVersion]: ...

    def list(self, name: str | None = None) -> list[SignedManifest]: ...

    def latest(self, name: str) -> SignedManifest | None: ...

    def close(self) -> None: ...


class SqliteVersionStore:
    """Published versions in the SQLite file at ``path`` (``":memory:"`` for tests)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._conn = _connect(self.path)

    def add(self, signed: SignedManifest, now: float) -> bool:
        """Publish ``signed`` at ``now``. True when new, False when this very signed
        manifest was already published; :class:`VersionConflict` when another one was."""
        m = signed.manifest
        row = (m.name, m.version, m.task, m.canonical_bytes().decode(), signed.key_id,
               signed.signature, signed.public_key, now)
        with self._lock, self._guard(f"publish {m.name} version {m.version}"), self._conn:
            old = self._conn.execute(
                f"SELECT {_COLUMNS} FROM model_versions WHERE name = ? AND version = ?",
                (m.name, m.version)).fetchone()
            if old is None:
                self._conn.execute("INSERT INTO model_versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                   row)
                return True
        refuse_different(_entry(old).signed, signed)
        return False

    def get(self, name: str, version: str) -> PublishedVersion:
        """The published version; :class:`RepositoryError` (404) when unknown."""
        with self._lock, self._guard("read a version"):
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM model_versions WHERE name = ? AND version = ?",
                (name, version)).fetchone()
        if row is None:
            raise RepositoryError(f"{name} version {version} is not published",
                                  hint=f"list the versions with `tierlink model list {name}`")
        return _entry(row)

    def entries(self, name: str | None = None) -> list[PublishedVersion]:
        """Every published version (of ``name``), by name then publication time."""
        where, args = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        with self._lock, self._guard("list versions"):
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM model_versions {where} {_ORDER}", args).fetchall()
        return [_entry(row) for row in rows]

    def list(self, name: str | None = None) -> list[SignedManifest]:
        """The signed manifests of :meth:`entries`, in the same order."""
        return [e.signed for e in self.entries(name)]

    def latest(self, name: str) -> SignedManifest | None:
        """The most recently published version of ``name``; None when it has none."""
        with self._lock, self._guard("read the latest version"):
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM model_versions WHERE name = ?"
                " ORDER BY published_at DESC, rowid DESC LIMIT 1", (name,)).fetchone()
        return None if row is None else _entry(row).signed

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _guard(self, action: str) -> Any:
        return _sqlite_errors(self.path, action)


def refuse_different(existing: SignedManifest, signed: SignedManifest) -> None:
    """A publish of ``signed`` where ``existing`` is already published under its name and
    version: nothing to do when it is the same, :class:`VersionConflict` otherwise."""
    m = signed.manifest
    if (existing.manifest, existing.signature) != (m, signed.signature):
        raise VersionConflict(
            f"{m.name} version {m.version} is already published with different "
            f"content (onnx {existing.manifest.onnx_sha256[:12]}..., key "
            f"{existing.key_id}); versions are immutable")


def _entry(row: tuple[str, str, str, str, float]) -> PublishedVersion:
    manifest, key, signature, public_key, published_at = row
    signed = SignedManifest(VersionManifest.from_dict(json.loads(manifest)), key, signature,
                            public_key)
    return PublishedVersion(signed, published_at)


def _connect(path: str) -> sqlite3.Connection:
    return open_store(path, _SCHEMA, _unavailable, "version store")


def _sqlite_errors(path: str, action: str) -> AbstractContextManager[None]:
    return mapped_errors(_unavailable, f"version store {path} failed to {action}")


def _unavailable(message: str) -> RepositoryError:
    err = RepositoryError(message, hint="check the disk and the permissions of the control "
                          "plane's --db file")
    err.http_status = 503
    return err
