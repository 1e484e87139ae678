"""Ed25519 keys and manifest signatures (the ``cryptography`` package).

* Private keys live in PEM files (PKCS8, unencrypted, mode 0600), made by
  :func:`generate_key` (``tierlink model keygen``), which never overwrites a file.
* Public keys travel as strings ``"ed25519:<base64 of the 32 raw bytes>"`` (fleet file
  ``trusted_keys:``, node spec ``trusted_keys``); :func:`key_id` is the first 16 hex digits
  of the sha256 of the raw bytes.
* :func:`sign_manifest` signs a manifest's canonical bytes; :func:`verify_manifest` checks a
  :class:`~tierlink.repo.manifest.SignedManifest` against a set of trusted public keys and
  returns the signer's key id, or raises :class:`~tierlink.errors.ArtifactRejected`
  (unsigned, unknown key, bad signature).

Trust: an empty trust set refuses everything unless the caller passes
``allow_any_key=True`` — then a signature is accepted if it verifies under the public key the
manifest carries (self-consistent), which is what a control plane with no
``trusted_publishers`` does. Unsigned manifests are refused in every mode.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tierlink.errors import ArtifactRejected, ConfigError
from tierlink.repo.manifest import SignedManifest, VersionManifest

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

KEY_PREFIX = "ed25519:"
_KEY_HINT = ("a public key is 'ed25519:' + base64 of 32 bytes, as `tierlink model keygen` "
             "prints it")
_TRUST_HINT = ("add the publisher's public key (`tierlink model keygen` printed it) to "
               "`trusted_keys` in the fleet file, or republish signed by a trusted key")


def generate_key(path: Path | str) -> str:
    """Make a new ed25519 key, write it to ``path`` (PEM PKCS8, mode 0600; the file must not
    exist) and return its public key string. :class:`ConfigError` when the file exists or
    cannot be written."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        # O_EXCL: never replace a key someone may already have published with.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"key file {path} already exists; not overwriting it",
                          hint="choose another --out path, or delete the old key on purpose")\
            from None
    except OSError as exc:
        raise ConfigError(f"cannot create key file {path}: {exc}",
                          hint="check that the directory exists and is writable") from exc
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    return public_key_string(key)


def load_private_key(path: Path | str) -> Ed25519PrivateKey:
    """The ed25519 private key in the PEM file at ``path``; :class:`ConfigError` when the
    file is missing, unreadable, or not an unencrypted ed25519 key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    hint = "make a key with `tierlink model keygen --out PATH`"
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read key file {path}: {exc}", hint=hint) from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"key file {path} is not an unencrypted PEM private key: {exc}",
                          hint=hint) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"key file {path} holds a {type(key).__name__}, not an ed25519 key",
                          hint=hint)
    return key


def public_key_string(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """``"ed25519:<base64>"`` of ``key``'s public half."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def parse_public_key(text: str) -> Ed25519PublicKey:
    """The public key of a ``"ed25519:<base64>"`` string; :class:`ConfigError` naming what is
    wrong with a malformed one."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        return Ed25519PublicKey.from_public_bytes(_raw_public(text))
    except ValueError as exc:
        raise ConfigError(f"public key {text[:40]!r} is not an ed25519 key: {exc}",
                          hint=_KEY_HINT) from None


def key_id(public_key: str) -> str:
    """First 16 hex digits of sha256 of the raw public key bytes of a key string."""
    return hashlib.sha256(_raw_public(public_key)).hexdigest()[:16]


def sign_manifest(manifest: VersionManifest, private_key: Ed25519PrivateKey) -> SignedManifest:
    """``manifest`` signed by ``private_key`` (ed25519 over its canonical bytes)."""
    public = public_key_string(private_key)
    signature = private_key.sign(manifest.canonical_bytes())
    return SignedManifest(manifest, key_id(public), base64.b64encode(signature).decode("ascii"),
                          public)


def verify_manifest(signed: SignedManifest, trusted: Iterable[str], *,
                    allow_any_key: bool = False) -> str:
    """The signer's key id when ``signed`` carries a valid signature by one of the
    ``trusted`` public key strings (or, with ``allow_any_key`` and no trusted keys, by the
    public key it carries). :class:`ArtifactRejected` otherwise: unsigned, unknown key id,
    bad signature. A malformed trusted key is a :class:`ConfigError`."""
    what = f"{signed.manifest.name} version {signed.manifest.version}"
    if not signed.signature:
        raise ArtifactRejected(f"{what} is unsigned",
                               hint="publish it with `tierlink model publish --key KEY`")
    keys = {key_id(k): k for k in trusted}
    public = _signing_key(signed, keys, allow_any_key, what)
    from cryptography.exceptions import InvalidSignature

    try:
        parse_public_key(public).verify(_signature_bytes(signed, what),
                                        signed.manifest.canonical_bytes())
    except InvalidSignature:
        raise ArtifactRejected(
            f"{what}: bad signature by key {signed.key_id} (the manifest was changed after "
            "signing, or signed by another key)", hint=_TRUST_HINT) from None
    return signed.key_id


def _signing_key(signed: SignedManifest, keys: dict[str, str], allow_any_key: bool,
                 what: str) -> str:
    """The public key string to verify ``signed`` with (see :func:`verify_manifest`)."""
    if signed.key_id in keys:
        return keys[signed.key_id]
    if keys or not allow_any_key:
        trust = ", ".join(sorted(keys)) or "none"
        raise ArtifactRejected(f"{what} is signed by key {signed.key_id or '(none)'}, which "
                               f"is not trusted here (trusted key ids: {trust})",
                               hint=_TRUST_HINT)
    try:
        carried = key_id(signed.public_key)
    except ConfigError as exc:
        raise ArtifactRejected(f"{what}: the public key it carries is malformed: "
                               f"{exc.message}", hint=_TRUST_HINT) from None
    if carried != signed.key_id:
        raise ArtifactRejected(f"{what}: key id {signed.key_id} does not match the public key "
                               f"it carries ({carried})", hint=_TRUST_HINT)
    return signed.public_key


def _signature_bytes(signed: SignedManifest, what: str) -> bytes:
    try:
        raw = base64.b64decode(signed.signature, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 64:
        raise ArtifactRejected(f"{what}: the signature is not base64 of 64 bytes",
                               hint=_TRUST_HINT)
    return raw


def _raw_public(text: str) -> bytes:
    if not isinstance(text, str) or not text.startswith(KEY_PREFIX):
        shown = repr(text)[:40]
        raise ConfigError(f"public key {shown} does not start with {KEY_PREFIX!r}",
                          hint=_KEY_HINT)
    try:
        raw = base64.b64decode(text[len(KEY_PREFIX):], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"public key {text[:40]!r} is not valid base64: {exc}",
                          hint=_KEY_HINT) from None
    if len(raw) != 32:
        raise ConfigError(f"public key {text[:40]!r} holds {len(raw)} bytes, not 32",
                          hint=_KEY_HINT)
    return raw
