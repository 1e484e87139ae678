"""Ed25519 keys and manifest signatures: who signed, and refusals with a clear reason."""

from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from repo_support import Artifact
from tierlink.errors import ArtifactRejected, ConfigError
from tierlink.repo.signing import (
    generate_key,
    key_id,
    load_private_key,
    parse_public_key,
    public_key_string,
    sign_manifest,
    verify_manifest,
)


def test_generate_key_writes_a_private_pem_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "publisher.pem"
    public = generate_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public_key_string(load_private_key(path)) == public
    assert public.startswith("ed25519:") and len(key_id(public)) == 16
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="already exists"):
        generate_key(path)
    assert path.read_bytes() == before


def test_load_private_key_refuses_what_is_not_an_ed25519_pem(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    with pytest.raises(ConfigError, match="not an unencrypted PEM"):
        load_private_key(junk)
    with pytest.raises(ConfigError, match="cannot read key file"):
        load_private_key(tmp_path / "missing.pem")


@pytest.mark.parametrize(("text", "problem"), [
    ("rsa:AAAA", "does not start with 'ed25519:'"),
    ("ed25519:not base64!", "not valid base64"),
    ("ed25519:AAAA", "holds 3 bytes, not 32"),
])
def test_malformed_public_keys_are_config_errors(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_public_key(text)
    with pytest.raises(ConfigError):
        key_id(text)


def test_a_trusted_signature_verifies(artifact: Artifact, public: str) -> None:
    assert verify_manifest(artifact.signed, [public]) == key_id(public)
    assert artifact.signed.key_id == key_id(public)


def test_unsigned_is_refused_even_when_any_key_is_allowed(artifact: Artifact,
                                                         public: str) -> None:
    unsigned = replace(artifact.signed, signature="")
    for trusted, any_key in (([public], False), ([], True)):
        with pytest.raises(ArtifactRejected, match="is unsigned"):
            verify_manifest(unsigned, trusted, allow_any_key=any_key)


def test_an_untrusted_key_is_refused_naming_it(artifact: Artifact,
                                               other_key: Ed25519PrivateKey) -> None:
    other = public_key_string(other_key)
    with pytest.raises(ArtifactRejected, match="not trusted here") as info:
        verify_manifest(artifact.signed, [other])
    assert artifact.signed.key_id in info.value.message
    assert key_id(other) in info.value.message


def test_a_field_changed_after_signing_is_a_bad_signature(artifact: Artifact,
                                                          public: str) -> None:
    better = replace(artifact.manifest, validation=replace(artifact.manifest.validation,
                                                           accuracy=0.99))
    with pytest.raises(ArtifactRejected, match="bad signature"):
        verify_manifest(replace(artifact.signed, manifest=better), [public])
    with pytest.raises(ArtifactRejected, match="not base64 of 64 bytes"):
        verify_manifest(replace(artifact.signed, signature="AAAA"), [public])


def test_no_trusted_keys_refuses_unless_any_key_is_allowed(
        artifact: Artifact, key: Ed25519PrivateKey, other_key: Ed25519PrivateKey) -> None:
    with pytest.raises(ArtifactRejected, match=r"trusted key ids: none"):
        verify_manifest(artifact.signed, [])
    assert verify_manifest(artifact.signed, [], allow_any_key=True) == artifact.signed.key_id
    # Self-consistent means the carried key matches the key id and verifies the signature.
    swapped = replace(artifact.signed, public_key=public_key_string(other_key))
    with pytest.raises(ArtifactRejected, match="does not match the public key"):
        verify_manifest(swapped, [], allow_any_key=True)
    forged = sign_manifest(artifact.manifest, other_key)
    forged = replace(forged, key_id=artifact.signed.key_id,
                     public_key=artifact.signed.public_key)
    with pytest.raises(ArtifactRejected, match="bad signature"):
        verify_manifest(forged, [], allow_any_key=True)
