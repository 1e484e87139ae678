"""What a published model version is: its manifest, and the manifest with its signature.

A version ``(name, version)`` is two files, the ONNX graph and its JSON model card, each
named by sha256 and size in a :class:`VersionManifest` with change notes and the
:class:`Validation` measured when it was published. A publisher signs the manifest's
:meth:`~VersionManifest.canonical_bytes` with ed25519 (:mod:`tierlink.repo.signing`); the
result travels as a :class:`SignedManifest`.

Canonical form: ``json.dumps(to_dict(), sort_keys=True, separators=(",", ":"))``, ASCII.
``to_dict`` writes every float field as a float (``1.0``, never ``1``) so a manifest read
back with :meth:`VersionManifest.from_dict` has the very bytes that were signed.

``from_dict`` is strict (unknown or missing fields, wrong types, bad hashes, unsafe names
raise :class:`~tierlink.errors.ArtifactRejected` naming the field): a manifest is input from
the network, and names and versions become directory names on nodes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tierlink.errors import ArtifactRejected

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""A model name or version: letters, digits, ``.``, ``_``, ``-``; 1..128 characters, not
starting with a dot (safe as a directory name and a URL path segment)."""

SHA256_PATTERN = r"^[0-9a-f]{64}$"
"""A sha256 as 64 lower-case hex digits."""

_NAME = re.compile(NAME_PATTERN)
_SHA = re.compile(SHA256_PATTERN)
_MANIFEST_HINT = "build the manifest with `tierlink model publish` (tierlink.repo.publish)"


def is_safe_name(text: str) -> bool:
    """True when ``text`` may be a model name or version (see :data:`NAME_PATTERN`)."""
    return bool(_NAME.fullmatch(text))


def is_sha256(text: str) -> bool:
    """True when ``text`` is 64 lower-case hex digits."""
    return bool(_SHA.fullmatch(text))


@dataclass(frozen=True, slots=True)
class Validation:
    """Accuracy measured when the version was published: ``accuracy`` (0..1, top-1) of the
    ONNX graph on ``n`` images of the ``split`` (``"test"``) of ``dataset`` (the zoo task,
    e.g. ``fmnist``), at ``measured_at`` (epoch seconds)."""

    dataset: str
    split: str
    n: int
    accuracy: float
    measured_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "split": self.split, "n": self.n,
                "accuracy": float(self.accuracy), "measured_at": float(self.measured_at)}

    @classmethod
    def from_dict(cls, data: Any) -> Validation:
        """Parse ``data``; :class:`ArtifactRejected` naming the field when malformed."""
        d = _fields(data, "validation", ("dataset", "split", "n", "accuracy", "measured_at"))
        accuracy = _number(d, "accuracy", "validation")
        if not 0.0 <= accuracy <= 1.0:
            raise _bad("validation.accuracy", f"{accuracy} is not in 0..1")
        return cls(dataset=_text(d, "dataset", "validation"),
                   split=_text(d, "split", "validation"),
                   n=_count(d, "n", "validation"), accuracy=accuracy,
                   measured_at=_number(d, "measured_at", "validation"))


@dataclass(frozen=True, slots=True)
class VersionManifest:
    """One model version: which files (sha256 + size of the ONNX graph and of its card,
    whose ``version`` field equals ``version``), what changed (``notes``), how good it
    measured (``validation``), when it was made (``created_at``, epoch seconds)."""

    name: str
    task: str
    version: str
    onnx_sha256: str
    onnx_size: int
    card_sha256: str
    card_size: int
    notes: str
    validation: Validation
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "task": self.task, "version": self.version,
                "onnx_sha256": self.onnx_sha256, "onnx_size": self.onnx_size,
                "card_sha256": self.card_sha256, "card_size": self.card_size,
                "notes": self.notes, "validation": self.validation.to_dict(),
                "created_at": float(self.created_at)}

    def canonical_bytes(self) -> bytes:
        """The bytes a signature covers (see the module docstring)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: Any) -> VersionManifest:
        """Parse ``data``; :class:`ArtifactRejected` naming the field when malformed."""
        d = _fields(data, "manifest", ("name", "task", "version", "onnx_sha256", "onnx_size",
                                       "card_sha256", "card_size", "notes", "validation",
                                       "created_at"))
        return cls(name=_safe_name(d, "name"), task=_text(d, "task", "manifest"),
                   version=_safe_name(d, "version"), onnx_sha256=_sha(d, "onnx_sha256"),
                   onnx_size=_count(d, "onnx_size", "manifest"),
                   card_sha256=_sha(d, "card_sha256"),
                   card_size=_count(d, "card_size", "manifest"),
                   notes=_text(d, "notes", "manifest", empty=True),
                   validation=Validation.from_dict(d["validation"]),
                   created_at=_number(d, "created_at", "manifest"))


@dataclass(frozen=True, slots=True)
class SignedManifest:
    """A manifest with its ed25519 signature: ``signature`` is base64 of the 64 signature
    bytes over ``manifest.canonical_bytes()`` (``""``: unsigned), ``key_id`` names the
    signing key (:func:`tierlink.repo.signing.key_id`), ``public_key`` carries it as
    ``"ed25519:<base64>"`` so a verifier with no trust list can still check the signature
    is self-consistent (a node always verifies with its own trusted keys, not this one)."""

    manifest: VersionManifest
    key_id: str
    signature: str
    public_key: str = ""

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> str:
        return self.manifest.version

    def to_dict(self) -> dict[str, Any]:
        return {"manifest": self.manifest.to_dict(), "key_id": self.key_id,
                "signature": self.signature, "public_key": self.public_key}

    @classmethod
    def from_dict(cls, data: Any) -> SignedManifest:
        """Parse ``data`` (fields other than the four are ignored); :class:`ArtifactRejected`
        naming the field when malformed."""
        if not isinstance(data, Mapping):
            raise _bad("signed manifest", f"expected a JSON object, got {type(data).__name__}")
        for key in ("manifest", "key_id", "signature"):
            if key not in data:
                raise _bad(key, "missing")
        return cls(manifest=VersionManifest.from_dict(data["manifest"]),
                   key_id=_text(data, "key_id", "", empty=True),
                   signature=_text(data, "signature", "", empty=True),
                   public_key=_text(data, "public_key", "", empty=True)
                   if "public_key" in data else "")


@dataclass(frozen=True, slots=True)
class PublishedVersion:
    """A version as the repository lists it: the signed manifest and when it was
    published (epoch seconds, the control plane's clock)."""

    signed: SignedManifest
    published_at: float

    def to_dict(self) -> dict[str, Any]:
        m = self.signed.manifest
        return {"name": m.name, "version": m.version, "task": m.task,
                "published_at": self.published_at, "key_id": self.signed.key_id,
                "signed": self.signed.to_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> PublishedVersion:
        if not isinstance(data, Mapping) or "signed" not in data:
            raise _bad("version entry", "expected an object with 'signed' and 'published_at'")
        return cls(SignedManifest.from_dict(data["signed"]),
                   _number(data, "published_at", "version entry"))


# -- field parsing ---------------------------------------------------------------------------


def _bad(field: str, problem: str) -> ArtifactRejected:
    return ArtifactRejected(f"malformed manifest: {field}: {problem}", hint=_MANIFEST_HINT)


def _fields(data: Any, what: str, names: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise _bad(what, f"expected a JSON object, got {type(data).__name__}")
    missing = [n for n in names if n not in data]
    unknown = sorted(str(k) for k in data if k not in names)
    if missing:
        raise _bad(f"{what}.{missing[0]}", "missing")
    if unknown:
        raise _bad(f"{what}.{unknown[0]}", "unknown field (a newer publisher?)")
    return data


def _path(what: str, key: str) -> str:
    return f"{what}.{key}" if what else key


def _text(d: Mapping[str, Any], key: str, what: str, *, empty: bool = False) -> str:
    value = d[key]
    if not isinstance(value, str):
        raise _bad(_path(what, key), f"expected a string, got {type(value).__name__}")
    if not value and not empty:
        raise _bad(_path(what, key), "is empty")
    return value


def _safe_name(d: Mapping[str, Any], key: str) -> str:
    value = _text(d, key, "manifest")
    if not is_safe_name(value):
        raise _bad(f"manifest.{key}", f"{value[:40]!r} does not match {NAME_PATTERN}")
    return value


def _sha(d: Mapping[str, Any], key: str) -> str:
    value = _text(d, key, "manifest")
    if not is_sha256(value):
        raise _bad(f"manifest.{key}", f"{value[:70]!r} is not 64 lower-case hex digits")
    return value


def _count(d: Mapping[str, Any], key: str, what: str) -> int:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(_path(what, key), f"expected an integer >= 0, got {value!r}")
    return value


def _number(d: Mapping[str, Any], key: str, what: str) -> float:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise _bad(_path(what, key), f"expected a finite number, got {value!r}")
    return float(value)
