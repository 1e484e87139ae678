"""The SQLite version store: immutable versions, idempotent re-publish, shared database."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from repo_support import NOW, Artifact, make_artifact
from tierlink.control.store import SCHEMA_VERSION, SqliteRegistryStore
from tierlink.errors import RepositoryError, VersionConflict
from tierlink.repo.signing import sign_manifest
from tierlink.repo.store import SqliteVersionStore


@pytest.fixture(params=["sqlite", "etcd"])
def versions(request: pytest.FixtureRequest):
    """A version store on SQLite and on a real etcd cluster (a prefix of its own)."""
    if request.param == "sqlite":
        s = SqliteVersionStore(":memory:")
        yield s
        s.close()
        return
    from tierlink.etcd.client import Etcd
    from tierlink.repo.etcd_store import EtcdVersionStore

    with Etcd(request.getfixturevalue("etcd_cluster").endpoints) as etcd:
        yield EtcdVersionStore(etcd, prefix=request.getfixturevalue("etcd_prefix"))


def test_add_is_idempotent_and_a_different_artifact_conflicts(
        artifact: Artifact, other_key: Ed25519PrivateKey, versions) -> None:
    store = versions
    assert store.add(artifact.signed, NOW) is True
    assert store.add(artifact.signed, NOW + 5) is False  # a retried publish
    assert store.get("fmnist-small", "2").published_at == NOW
    changed = sign_manifest(replace(artifact.manifest, notes="something else"),
                            Ed25519PrivateKey.generate())
    for other in (changed, sign_manifest(artifact.manifest, other_key)):
        with pytest.raises(VersionConflict, match="already published") as info:
            store.add(other, NOW + 10)
        assert info.value.http_status == 409 and info.value.code == "version_conflict"
    assert store.get("fmnist-small", "2").signed == artifact.signed


def test_get_unknown_is_a_404(versions) -> None:
    with pytest.raises(RepositoryError, match="not published") as info:
        versions.get("fmnist-small", "9")
    assert info.value.http_status == 404


def test_list_orders_by_name_then_publication_and_latest(tmp_path: Path,
                                                         key: Ed25519PrivateKey,
                                                         versions) -> None:
    store = versions
    published = [("fmnist-small", "10", NOW + 1), ("fmnist-large", "1", NOW + 2),
                 ("fmnist-small", "9", NOW + 3)]
    for i, (name, version, when) in enumerate(published):
        store.add(make_artifact(tmp_path / str(i), key, name=name, version=version).signed,
                  when)
    assert [(s.name, s.version) for s in store.list()] == [
        ("fmnist-large", "1"), ("fmnist-small", "10"), ("fmnist-small", "9")]
    assert [s.version for s in store.list("fmnist-small")] == ["10", "9"]
    latest = store.latest("fmnist-small")
    assert latest is not None and latest.version == "9"  # published last, not sorted last
    assert store.latest("nope") is None


def test_shares_the_registry_database_without_touching_its_schema(
        tmp_path: Path, artifact: Artifact) -> None:
    db = tmp_path / "control.db"
    registry = SqliteRegistryStore(db)
    versions = SqliteVersionStore(db)
    versions.add(artifact.signed, NOW)
    assert registry.alive(NOW, 5.0) == []  # the registry still works beside it
    versions.close()
    registry.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    again = SqliteVersionStore(db)  # survives a restart
    assert again.get("fmnist-small", "2").signed == artifact.signed
    again.close()
    SqliteRegistryStore(db).close()  # and the registry reopens the shared file


def test_a_version_store_alone_leaves_user_version_to_the_registry(tmp_path: Path) -> None:
    db = tmp_path / "versions-first.db"
    SqliteVersionStore(db).close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    SqliteRegistryStore(db).close()  # the registry then initialises its tables as usual
