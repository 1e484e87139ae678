"""Published model versions on etcd, shared by control-plane replicas (the blobs stay in
content-addressed storage: :class:`~tierlink.repo.blobs.BlobStore`, a directory the
replicas share).

One key per version, ever: ``<prefix><name>/<version>`` holds the signed manifest and when
it was published. A publish is a transaction that writes the key only while it is absent,
so two replicas publishing the same version at once cannot both win; the same signed
manifest again is a no-op, anything else a :class:`~tierlink.errors.VersionConflict`.
"""

from __future__ import annotations

import json

from tierlink.errors import RepositoryError
from tierlink.etcd.client import Compare, Etcd, KeyValue, Op
from tierlink.repo.manifest import PublishedVersion, SignedManifest, VersionManifest
from tierlink.repo.store import refuse_different

DEFAULT_PREFIX = "/tierlink/versions/"


class EtcdVersionStore:
    """The version store of :mod:`tierlink.repo.store` on etcd (same methods)."""

    def __init__(self, etcd: Etcd, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.etcd = etcd
        self.prefix = prefix

    def add(self, signed: SignedManifest, now: float) -> bool:
        m = signed.manifest
        key = f"{self.prefix}{m.name}/{m.version}"
        value = json.dumps({"manifest": m.canonical_bytes().decode(), "key_id": signed.key_id,
                            "signature": signed.signature, "public_key": signed.public_key,
                            "published_at": now}, separators=(",", ":")).encode()
        held, _ = self.etcd.txn([Compare(key, "version", 0)], [Op("put", key, value)])
        if held:
            return True
        old = self.etcd.get(key)
        if old is None:  # cannot happen: versions are never deleted
            raise RepositoryError(f"{m.name} version {m.version} vanished while publishing")
        refuse_different(_entry(old).signed, signed)
        return False

    def get(self, name: str, version: str) -> PublishedVersion:
        kv = self.etcd.get(f"{self.prefix}{name}/{version}")
        if kv is None:
            raise RepositoryError(f"{name} version {version} is not published",
                                  hint=f"list the versions with `tierlink model list {name}`")
        return _entry(kv)

    def entries(self, name: str | None = None) -> list[PublishedVersion]:
        """Every published version (of ``name``), by name then publication time."""
        kvs, _ = self.etcd.prefix(self.prefix if name is None else f"{self.prefix}{name}/")
        found = [_entry(kv) for kv in kvs]
        return sorted(found, key=lambda e: (e.signed.manifest.name, e.published_at))

    def list(self, name: str | None = None) -> list[SignedManifest]:
        return [e.signed for e in self.entries(name)]

    def latest(self, name: str) -> SignedManifest | None:
        found = self.entries(name)
        return found[-1].signed if found else None

    def close(self) -> None:
        """Nothing to release: the etcd client is the caller's."""


def _entry(kv: KeyValue) -> PublishedVersion:
    stored = json.loads(kv.value)
    signed = SignedManifest(VersionManifest.from_dict(json.loads(stored["manifest"])),
                            stored["key_id"], stored["signature"], stored["public_key"])
    return PublishedVersion(signed, float(stored["published_at"]))
