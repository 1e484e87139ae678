"""A content-addressed blob store on disk: each file is named by its sha256.

Layout under ``root``::

    sha256/ab/ab12...ef      one file per blob (64 hex digits), never modified once there
    tmp/                     uploads in progress (same filesystem, so the rename is atomic)

A blob is written to a temp file, fsynced, its hash checked, then renamed into place and the
directory fsynced: a reader sees a whole, verified blob or none, also after a crash. A
mismatch (or an upload past ``max_bytes``) removes the temp file and raises
:class:`~tierlink.errors.ArtifactRejected`. Temp files older than an hour (left by a killed
process) are removed when the store opens. Every sha256 given by a caller is checked to be
64 lower-case hex digits before it touches a path, so no name can leave ``root``.

Thread-safe: writers never share a temp file and the final rename is atomic (two uploads of
the same blob both succeed; the content is the same).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

from tierlink.durable import fsync_dir
from tierlink.errors import ArtifactRejected, InvalidRequest, RepositoryError
from tierlink.repo.manifest import is_sha256

DEFAULT_MAX_BYTES = 4 * 1024**3
STALE_TMP_S = 3600.0
_UPLOAD_HINT = "upload it with PUT /v1/blobs/{sha256} (`tierlink model publish` does)"


def check_sha(sha: str) -> str:
    """``sha`` if it is 64 lower-case hex digits, else :class:`InvalidRequest` (400)."""
    if not isinstance(sha, str) or not is_sha256(sha):
        raise InvalidRequest(f"{str(sha)[:80]!r} is not a sha256 (64 lower-case hex digits)",
                             hint="name blobs by the lower-case hex sha256 of their bytes")
    return sha


class BlobStore:
    """Blobs under ``root`` (created if missing), each at most ``max_bytes``."""

    def __init__(self, root: Path | str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._tmp = self.root / "tmp"
        try:
            (self.root / "sha256").mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(exist_ok=True)
        except OSError as exc:
            raise _disk_error(f"cannot create the blob store at {self.root}", exc) from exc
        self._sweep_stale()

    def has(self, sha: str) -> bool:
        return self._final(check_sha(sha)).is_file()

    def path(self, sha: str) -> Path:
        """Where blob ``sha`` is; :class:`RepositoryError` (404) when it is not stored."""
        path = self._final(check_sha(sha))
        if not path.is_file():
            raise RepositoryError(f"blob {sha} is not in the repository", hint=_UPLOAD_HINT)
        return path

    def writer(self, expect_sha: str | None = None) -> BlobWriter:
        """A writer for one blob (see :class:`BlobWriter`); ``expect_sha``: the hash the
        bytes must have (None: name it by whatever they hash to)."""
        return BlobWriter(self, None if expect_sha is None else check_sha(expect_sha))

    def put_stream(self, chunks: Iterable[bytes], expect_sha: str) -> str:
        """Store the concatenated ``chunks``; they must hash to ``expect_sha``."""
        with self.writer(expect_sha) as w:
            for chunk in chunks:
                w.write(chunk)
            w.commit()
        return w.sha256

    def put_bytes(self, data: bytes, expect_sha: str | None = None) -> str:
        """Store ``data``; returns its sha256 (must equal ``expect_sha`` when given)."""
        with self.writer(expect_sha) as w:
            w.write(data)
            w.commit()
        return w.sha256

    def put_file(self, path: Path | str) -> str:
        """Store a copy of the file at ``path``; returns its sha256."""
        with self.writer() as w, open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                w.write(block)
            w.commit()
        return w.sha256

    def remove(self, sha: str) -> None:
        """Remove blob ``sha`` (nothing when it is not stored). The model repository never
        does (a published version is immutable); a store whose blobs are its own records'
        does when it drops the record (``control/etcd_hard_examples.py``)."""
        try:
            self._final(check_sha(sha)).unlink(missing_ok=True)
        except OSError as exc:
            raise _disk_error(f"cannot remove blob {sha}", exc) from exc

    def _final(self, sha: str) -> Path:
        return self.root / "sha256" / sha[:2] / sha

    def _sweep_stale(self) -> None:
        cutoff = time.time() - STALE_TMP_S  # file mtimes are wall-clock: compare with one
        for leftover in self._tmp.glob("*.tmp"):
            try:
                if leftover.stat().st_mtime < cutoff:
                    leftover.unlink()
            except OSError:
                pass  # another process took it, or it cannot be removed: harmless


class BlobWriter:
    """Writes one blob: :meth:`write` chunks, then :meth:`commit` (fsync, check the hash,
    rename into place). Leaving the ``with`` block without a commit (or on an error) removes
    the temp file. ``created`` tells whether the commit added a new blob."""

    def __init__(self, store: BlobStore, expect_sha: str | None) -> None:
        self.store = store
        self.expect_sha = expect_sha
        self.size = 0
        self.sha256 = ""
        self.created = False
        self._digest = hashlib.sha256()
        self._tmp = store._tmp / f"{expect_sha or 'upload'}.{secrets.token_hex(8)}.tmp"
        try:
            self._file = open(self._tmp, "xb")  # noqa: SIM115 - closed in commit / abort
        except OSError as exc:
            raise _disk_error(f"cannot write to the blob store at {store.root}", exc) from exc
        self._done = False

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.store.max_bytes:
            self.abort()
            raise ArtifactRejected(f"upload is larger than the store's limit of "
                                   f"{self.store.max_bytes} bytes",
                                   hint="is this the right file?")
        self._digest.update(chunk)
        try:
            self._file.write(chunk)
        except OSError as exc:
            self.abort()
            raise _disk_error("cannot write a blob", exc) from exc

    def commit(self) -> bool:
        """Make the blob visible; returns True when it is new (False: it was already
        stored). :class:`ArtifactRejected` (temp removed) when the hash is not expected."""
        self.sha256 = self._digest.hexdigest()
        if self.expect_sha is not None and self.sha256 != self.expect_sha:
            self.abort()
            raise ArtifactRejected(
                f"upload does not match its name: sha256 {self.sha256[:12]}..., expected "
                f"{self.expect_sha[:12]}... ({self.size} bytes received)",
                hint="the file changed or was corrupted on the way: upload it again")
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self.created = self._place()
        except OSError as exc:
            self.abort()
            raise _disk_error("cannot store a blob", exc) from exc
        self._done = True
        return self.created

    def abort(self) -> None:
        """Drop the upload (idempotent)."""
        if self._done:
            return
        self._done = True
        self._file.close()
        self._tmp.unlink(missing_ok=True)

    def _place(self) -> bool:
        final = self.store._final(self.sha256)
        if final.is_file():
            self._tmp.unlink(missing_ok=True)
            return False
        final.parent.mkdir(exist_ok=True)
        os.replace(self._tmp, final)
        fsync_dir(final.parent)
        return True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.abort()




def _disk_error(what: str, exc: OSError) -> RepositoryError:
    err = RepositoryError(f"{what}: {exc}",
                          hint="check free space and permissions of the repository directory")
    err.http_status = 503
    return err
