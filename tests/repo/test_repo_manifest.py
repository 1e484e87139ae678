"""Manifests: round trips through JSON keep the signed bytes; malformed ones name the field."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from repo_support import NOW, Artifact, validation
from tierlink.errors import ArtifactRejected
from tierlink.repo.manifest import (
    PublishedVersion,
    SignedManifest,
    Validation,
    VersionManifest,
)


def test_signed_manifest_round_trips_through_json(artifact: Artifact) -> None:
    text = json.dumps(artifact.signed.to_dict())
    back = SignedManifest.from_dict(json.loads(text))
    assert back == artifact.signed
    assert back.manifest.canonical_bytes() == artifact.manifest.canonical_bytes()
    entry = PublishedVersion(back, NOW)
    assert PublishedVersion.from_dict(json.loads(json.dumps(entry.to_dict()))) == entry


def test_canonical_bytes_are_sorted_compact_and_float_stable(artifact: Artifact) -> None:
    m = replace(artifact.manifest, created_at=int(NOW),  # type: ignore[arg-type]
                validation=replace(validation(), accuracy=1))  # type: ignore[arg-type]
    raw = m.canonical_bytes()
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert b'"accuracy":1.0' in raw  # an int would read back as a float: different bytes
    assert VersionManifest.from_dict(json.loads(raw)).canonical_bytes() == raw


def _broken(artifact: Artifact, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(artifact.signed.to_dict()))
    target = body
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


@pytest.mark.parametrize(("path", "value", "field"), [
    (("manifest", "onnx_sha256"), "AB" * 32, "manifest.onnx_sha256"),
    (("manifest", "card_sha256"), KeyError, "manifest.card_sha256: missing"),
    (("manifest", "onnx_size"), -1, "manifest.onnx_size"),
    (("manifest", "onnx_size"), True, "manifest.onnx_size"),
    (("manifest", "name"), "../../etc", "manifest.name"),
    (("manifest", "version"), "", "manifest.version"),
    (("manifest", "notes"), 3, "manifest.notes"),
    (("manifest", "extra"), 1, "manifest.extra: unknown field"),
    (("manifest", "validation", "accuracy"), 1.5, "validation.accuracy"),
    (("manifest", "validation", "n"), "800", "validation.n"),
    (("manifest", "validation"), [], "validation: expected a JSON object"),
    (("manifest", "created_at"), float("nan"), "manifest.created_at"),
    (("signature",), KeyError, "signature: missing"),
    (("key_id",), 7, "key_id"),
])
def test_malformed_manifests_are_rejected_naming_the_field(
        artifact: Artifact, path: tuple[str, ...], value: Any, field: str) -> None:
    with pytest.raises(ArtifactRejected, match="malformed manifest") as info:
        SignedManifest.from_dict(_broken(artifact, path, value))
    assert field in info.value.message
    assert info.value.http_status == 422


def test_not_an_object_is_rejected() -> None:
    with pytest.raises(ArtifactRejected, match="expected a JSON object"):
        SignedManifest.from_dict(["manifest"])
    with pytest.raises(ArtifactRejected, match="validation"):
        Validation.from_dict(None)
