"""verify_artifact: the files must be the ones the signed manifest names, byte for byte."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from repo_support import Artifact
from tierlink.errors import ArtifactRejected
from tierlink.models.card import load_card
from tierlink.repo.manifest import SignedManifest
from tierlink.repo.signing import sign_manifest
from tierlink.repo.verify import hash_file, verify_artifact


def test_the_published_files_verify(artifact: Artifact, public: str) -> None:
    key = verify_artifact(artifact.signed, artifact.onnx, artifact.card, [public])
    assert key == artifact.signed.key_id
    card = json.loads(artifact.card.read_text())
    assert card["version"] == "2" and card["sha256"] == artifact.manifest.onnx_sha256
    assert card["schema"] == 2  # published as the current card, whatever it was read from
    typed = load_card(artifact.card)
    assert (typed.name, typed.task, typed.version) == ("fmnist-small", "fmnist", "2")


def _flip_a_byte(path: Path, at: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_tampered_onnx_byte_is_refused_naming_the_file(artifact: Artifact,
                                                         public: str) -> None:
    _flip_a_byte(artifact.onnx)
    with pytest.raises(ArtifactRejected, match="ONNX graph") as info:
        verify_artifact(artifact.signed, artifact.onnx, artifact.card, [public])
    message = info.value.message
    assert str(artifact.onnx) in message
    assert f"expected {artifact.manifest.onnx_sha256[:12]}" in message
    assert f"sha256 {hash_file(artifact.onnx)[0][:12]}" in message


def test_a_truncated_onnx_is_refused_by_size(artifact: Artifact, public: str) -> None:
    artifact.onnx.write_bytes(artifact.onnx.read_bytes()[:-1])
    with pytest.raises(ArtifactRejected, match=r"ONNX graph .* bytes, the manifest says"):
        verify_artifact(artifact.signed, artifact.onnx, artifact.card, [public])


def test_a_tampered_card_is_refused_naming_it(artifact: Artifact, public: str) -> None:
    artifact.card.write_text(artifact.card.read_text().replace('"2"', '"3"'))
    with pytest.raises(ArtifactRejected, match="model card") as info:
        verify_artifact(artifact.signed, artifact.onnx, artifact.card, [public])
    assert str(artifact.card) in info.value.message


def test_a_card_of_another_version_is_refused(artifact: Artifact, public: str,
                                              key: Ed25519PrivateKey) -> None:
    # Signed over a card whose version field was never rewritten (not via publish).
    card = json.loads(artifact.card.read_text())
    card["version"] = "1"
    artifact.card.write_text(json.dumps(card))
    sha, size = hash_file(artifact.card)
    signed = sign_manifest(replace(artifact.manifest, card_sha256=sha, card_size=size), key)
    with pytest.raises(ArtifactRejected, match="says version '1', the manifest '2'"):
        verify_artifact(signed, artifact.onnx, artifact.card, [public])


def _resign_over(artifact: Artifact, card: object, key: Ed25519PrivateKey) -> SignedManifest:
    """The artifact's manifest signed over whatever ``card`` is now written (JSON)."""
    artifact.card.write_text(json.dumps(card))
    sha, size = hash_file(artifact.card)
    return sign_manifest(replace(artifact.manifest, card_sha256=sha, card_size=size), key)


def test_a_card_of_another_task_is_refused(artifact: Artifact, public: str,
                                           key: Ed25519PrivateKey) -> None:
    card = json.loads(artifact.card.read_text())
    card["task"] = "other-task"
    signed = _resign_over(artifact, card, key)
    with pytest.raises(ArtifactRejected, match="is for task 'other-task', the manifest says "
                                               "'fmnist'"):
        verify_artifact(signed, artifact.onnx, artifact.card, [public])


@pytest.mark.parametrize("card", [[], {"name": "fmnist-small", "version": "2"},
                                  {"schema": 99, "name": "fmnist-small", "task": "fmnist",
                                   "version": "2"}],
                         ids=["not-an-object", "no-task", "newer-schema"])
def test_a_signed_file_that_is_no_card_is_refused_naming_it(
        artifact: Artifact, public: str, key: Ed25519PrivateKey, card: object) -> None:
    signed = _resign_over(artifact, card, key)
    with pytest.raises(ArtifactRejected, match="model card") as info:
        verify_artifact(signed, artifact.onnx, artifact.card, [public])
    assert str(artifact.card) in info.value.message


def test_a_manifest_pointing_at_other_files_is_a_bad_signature(artifact: Artifact,
                                                               public: str) -> None:
    # The attacker swaps the file *and* fixes the hash in the manifest: the signature fails
    # before any hash is compared.
    _flip_a_byte(artifact.onnx)
    sha, _ = hash_file(artifact.onnx)
    forged = replace(artifact.signed, manifest=replace(artifact.manifest, onnx_sha256=sha))
    with pytest.raises(ArtifactRejected, match="bad signature"):
        verify_artifact(forged, artifact.onnx, artifact.card, [public])


def test_unsigned_and_untrusted_are_refused(artifact: Artifact, public: str,
                                            other_key: Ed25519PrivateKey) -> None:
    with pytest.raises(ArtifactRejected, match="unsigned"):
        verify_artifact(replace(artifact.signed, signature=""), artifact.onnx, artifact.card,
                        [public])
    resigned = sign_manifest(artifact.manifest, other_key)
    with pytest.raises(ArtifactRejected, match="not trusted"):
        verify_artifact(resigned, artifact.onnx, artifact.card, [public])


def test_a_missing_file_is_refused(artifact: Artifact, public: str) -> None:
    artifact.onnx.unlink()
    with pytest.raises(ArtifactRejected, match="cannot read"):
        verify_artifact(artifact.signed, artifact.onnx, artifact.card, [public])
