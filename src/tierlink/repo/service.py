"""The model repository's behaviour apart from HTTP: blobs in, versions published, listed.

A publisher uploads both files of a version as blobs (content-addressed), then posts the
signed manifest. :meth:`RepositoryService.publish` accepts it only when both blobs are
stored and :func:`tierlink.repo.verify.verify_artifact` passes on them — the signature,
sizes, hashes and the card's version — so the repository never lists a version a node
would refuse for a reason the control plane could see.

Trust: with ``trusted_publishers`` (public key strings) a signature must be by one of them.
With none, the control plane accepts any signature that verifies under the public key the
manifest carries (self-consistent) — nodes still decide with their own ``trusted_keys`` —
and it always refuses unsigned manifests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterable, Callable
from pathlib import Path
from typing import Any

from tierlink.errors import ArtifactRejected, InvalidRequest, RepositoryError
from tierlink.repo.blobs import BlobStore
from tierlink.repo.manifest import PublishedVersion, SignedManifest
from tierlink.repo.signing import key_id
from tierlink.repo.store import VersionStore
from tierlink.repo.verify import verify_artifact

log = logging.getLogger(__name__)

Clock = Callable[[], float]
MAX_MANIFEST_BYTES = 1 << 20
_UPLOAD_FIRST = "upload both files first with PUT /v1/blobs/{sha256} (`tierlink model publish` " \
                "does it for you)"


class RepositoryService:
    """Blob uploads, publication and listings over ``versions`` and ``blobs``.

    ``clock`` (epoch seconds) stamps ``published_at``. Malformed ``trusted_publishers``
    raise :class:`~tierlink.errors.ConfigError` here, at start-up, not at the first publish.
    """

    def __init__(self, versions: VersionStore, blobs: BlobStore,
                 trusted_publishers: tuple[str, ...] = (), clock: Clock = time.time) -> None:
        self.versions = versions
        self.blobs = blobs
        self.trusted_publishers = tuple(trusted_publishers)
        self.trusted_ids = tuple(key_id(k) for k in self.trusted_publishers)
        self.clock = clock

    async def put_blob(self, sha: str, chunks: AsyncIterable[bytes]) -> tuple[int, bool]:
        """Store an upload that must hash to ``sha``; ``(size, created)``. The bytes go to
        disk as they arrive; the fsync and rename run off the event loop."""
        with self.blobs.writer(sha) as writer:
            async for chunk in chunks:
                writer.write(chunk)
            created = await asyncio.to_thread(writer.commit)
        if created:
            log.info("blob %s stored (%d bytes)", sha[:12], writer.size)
        return writer.size, created

    def blob_path(self, sha: str) -> Path:
        return self.blobs.path(sha)

    def publish(self, name: str, body: bytes) -> tuple[PublishedVersion, bool]:
        """Publish the signed manifest in ``body`` (JSON) under model ``name``;
        ``(entry, created)``. Raises :class:`ArtifactRejected` (422), :class:`InvalidRequest`
        (400) or :class:`~tierlink.errors.VersionConflict` (409)."""
        signed = SignedManifest.from_dict(_json_body(body))
        if signed.manifest.name != name:
            raise InvalidRequest(f"the manifest is for model {signed.manifest.name!r}, posted "
                                 f"under {name!r}",
                                 hint="post to /v1/models/{the manifest's name}/versions")
        self._verify(signed)
        created = self.versions.add(signed, self.clock())
        m = signed.manifest
        if created:
            log.info("published %s version %s (key %s, accuracy %.4f on %d %s)", m.name,
                     m.version, signed.key_id, m.validation.accuracy, m.validation.n,
                     m.validation.dataset)
        return self.versions.get(m.name, m.version), created

    def models(self) -> list[dict[str, Any]]:
        """Every model with its versions (oldest first) and the latest one."""
        by_name: dict[str, list[PublishedVersion]] = {}
        for entry in self.versions.entries():
            by_name.setdefault(entry.signed.name, []).append(entry)
        return [{"name": name, "task": entries[-1].signed.manifest.task,
                 "latest": entries[-1].signed.version,
                 "versions": [e.to_dict() for e in entries]}
                for name, entries in by_name.items()]

    def versions_of(self, name: str) -> list[PublishedVersion]:
        """The versions of ``name``, oldest first; :class:`RepositoryError` (404) if none."""
        entries = self.versions.entries(name)
        if not entries:
            raise RepositoryError(f"no version of model {name!r} is published",
                                  hint="publish one with `tierlink model publish`, or list "
                                       "the models with `tierlink model list`")
        return entries

    def version(self, name: str, version: str) -> PublishedVersion:
        return self.versions.get(name, version)

    def _verify(self, signed: SignedManifest) -> None:
        m = signed.manifest
        for what, sha in (("ONNX graph", m.onnx_sha256), ("model card", m.card_sha256)):
            if not self.blobs.has(sha):
                raise ArtifactRejected(f"{m.name} version {m.version}: the {what} blob "
                                       f"{sha[:12]}... is not in the repository",
                                       hint=_UPLOAD_FIRST)
        verify_artifact(signed, self.blobs.path(m.onnx_sha256), self.blobs.path(m.card_sha256),
                        self.trusted_publishers, allow_any_key=not self.trusted_publishers)


def _json_body(body: bytes) -> Any:
    if len(body) > MAX_MANIFEST_BYTES:
        raise InvalidRequest(f"a signed manifest of {len(body)} bytes is larger than the "
                             f"{MAX_MANIFEST_BYTES} allowed", hint="is this a manifest?")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ArtifactRejected(f"malformed manifest: the body is not JSON: {exc}",
                               hint="post a SignedManifest's to_dict() as JSON") from None
