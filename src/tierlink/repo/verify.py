"""Check a downloaded (or uploaded) artifact against its signed manifest.

:func:`verify_artifact` is what stands between a file on disk and a version becoming active
on a node (and being accepted by the control plane): the signature by a trusted key first
(every other check compares against the manifest, so the manifest itself must be genuine),
then both files' sizes and sha256 (streamed, never read whole into memory), then the card:
JSON, its ``version`` equal to the manifest's (and ``task``, when the card names one).
Each failure is an :class:`~tierlink.errors.ArtifactRejected` saying exactly what failed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from tierlink.errors import ArtifactRejected, ModelError
from tierlink.models.card import load_card
from tierlink.repo.manifest import SignedManifest
from tierlink.repo.signing import verify_manifest

CHUNK = 1 << 20
_REFETCH_HINT = ("the file was changed or corrupted after publishing: fetch the version "
                 "again, or republish it with `tierlink model publish`")


def hash_file(path: Path | str) -> tuple[str, int]:
    """``(sha256 hex, size in bytes)`` of a file, read in 1 MiB chunks.
    :class:`ArtifactRejected` when it cannot be read."""
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                digest.update(block)
                size += len(block)
    except OSError as exc:
        raise ArtifactRejected(f"cannot read {path}: {exc}", hint=_REFETCH_HINT) from exc
    return digest.hexdigest(), size


def verify_artifact(signed: SignedManifest, onnx_path: Path | str, card_path: Path | str,
                    trusted: Iterable[str], *, allow_any_key: bool = False) -> str:
    """Verify ``signed`` (see :func:`tierlink.repo.signing.verify_manifest`, whose
    ``trusted`` / ``allow_any_key`` this takes) and that ``onnx_path`` and ``card_path`` are
    the files it names. Returns the signer's key id; raises :class:`ArtifactRejected`."""
    key = verify_manifest(signed, trusted, allow_any_key=allow_any_key)
    m = signed.manifest
    check_file("ONNX graph", onnx_path, m.onnx_sha256, m.onnx_size)
    check_file("model card", card_path, m.card_sha256, m.card_size)
    check_card(signed, card_path)
    return key


def check_file(what: str, path: Path | str, sha256: str, size: int) -> None:
    """:class:`ArtifactRejected` unless the file at ``path`` has ``size`` bytes and hashes
    to ``sha256``; ``what`` names it in the message ("ONNX graph")."""
    got_sha, got_size = hash_file(path)
    if got_size != size:
        raise ArtifactRejected(f"{what} {path} has {got_size} bytes, the manifest says {size}",
                               hint=_REFETCH_HINT)
    if got_sha != sha256:
        raise ArtifactRejected(f"{what} {path} does not match the manifest: sha256 "
                               f"{got_sha[:12]}..., expected {sha256[:12]}...",
                               hint=_REFETCH_HINT)


def check_card(signed: SignedManifest, card_path: Path | str) -> None:
    """The card is a JSON object whose ``version`` is the manifest's (and whose ``task``,
    when present, is the manifest's)."""
    m = signed.manifest
    try:
        card = load_card(Path(card_path))
    except ModelError as exc:
        raise ArtifactRejected(exc.message, hint=_REFETCH_HINT) from exc
    if card.version != m.version:
        raise ArtifactRejected(
            f"model card {card_path} says version {card.version!r}, the manifest "
            f"{m.version!r}", hint="publish with `tierlink model publish`, which sets the "
            "card's version")
    if card.task != m.task:
        raise ArtifactRejected(f"model card {card_path} is for task {card.task!r}, the "
                               f"manifest says {m.task!r}", hint=_REFETCH_HINT)
