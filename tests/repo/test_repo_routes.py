"""The repository's HTTP routes end to end (in-process app, TestClient)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from repo_support import NOW, Artifact, FakeClock, make_artifact, repo_app
from tierlink.repo.signing import sign_manifest


@pytest.fixture
def client(tmp_path: Path, public: str, clock: FakeClock) -> Iterator[TestClient]:
    app = repo_app(tmp_path / "control", (public,), clock)
    with TestClient(app) as c:
        yield c
    app.state.repository.versions.close()


def upload(client: TestClient, path: Path) -> int:
    data = path.read_bytes()
    return client.put(f"/v1/blobs/{hashlib.sha256(data).hexdigest()}", content=data).status_code


def publish(client: TestClient, artifact: Artifact, *, blobs: bool = True) -> tuple[int, dict]:
    if blobs:
        upload(client, artifact.onnx)
        upload(client, artifact.card)
    answer = client.post(f"/v1/models/{artifact.manifest.name}/versions",
                         json=artifact.signed.to_dict())
    return answer.status_code, answer.json()


def test_blobs_upload_download_head(client: TestClient, artifact: Artifact) -> None:
    sha = artifact.manifest.onnx_sha256
    assert upload(client, artifact.onnx) == 201
    assert upload(client, artifact.onnx) == 200
    got = client.get(f"/v1/blobs/{sha}")
    assert got.status_code == 200 and got.content == artifact.onnx.read_bytes()
    assert got.headers["x-tierlink-sha256"] == sha
    head = client.head(f"/v1/blobs/{sha}")
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == artifact.manifest.onnx_size
    missing = client.get(f"/v1/blobs/{'0' * 64}")
    assert missing.status_code == 404 and missing.json()["code"] == "repository_error"
    bad = client.get("/v1/blobs/..%2F..%2Fetc%2Fpasswd")
    assert bad.status_code in (400, 404)  # a 400 from us, or no route at all: never a file


def test_a_tampered_upload_is_refused_and_not_stored(client: TestClient,
                                                     artifact: Artifact) -> None:
    sha = artifact.manifest.onnx_sha256
    answer = client.put(f"/v1/blobs/{sha}", content=b"tampered" + artifact.onnx.read_bytes())
    assert answer.status_code == 422
    assert answer.json()["code"] == "artifact_rejected"
    assert f"expected {sha[:12]}" in answer.json()["error"]
    assert client.get(f"/v1/blobs/{sha}").status_code == 404
    assert client.put("/v1/blobs/not-a-hash", content=b"x").status_code == 400


def test_publish_list_show_and_idempotent_republish(client: TestClient, artifact: Artifact,
                                                    clock: FakeClock) -> None:
    status, body = publish(client, artifact)
    assert status == 201 and body["created"] is True and body["published_at"] == NOW
    clock.advance(60)
    status, body = publish(client, artifact)
    assert status == 200 and body["created"] is False and body["published_at"] == NOW
    models = client.get("/v1/models").json()["models"]
    assert [(m["name"], m["task"], m["latest"]) for m in models] == [
        ("fmnist-small", "fmnist", "2")]
    assert models[0]["versions"][0]["signed"] == artifact.signed.to_dict()
    versions = client.get("/v1/models/fmnist-small/versions").json()["versions"]
    assert [v["version"] for v in versions] == ["2"]
    shown = client.get("/v1/models/fmnist-small/versions/2").json()
    assert shown["signed"] == artifact.signed.to_dict()
    assert shown["key_id"] == artifact.signed.key_id


def test_a_different_artifact_under_a_published_version_is_a_409(
        client: TestClient, artifact: Artifact, tmp_path: Path,
        key: Ed25519PrivateKey) -> None:
    assert publish(client, artifact)[0] == 201
    other = make_artifact(tmp_path / "b", key, graph=b"another graph")
    status, body = publish(client, other)
    assert status == 409 and body["code"] == "version_conflict"
    assert "new --version" in body["hint"]


def test_publish_without_the_blobs_names_the_missing_one(client: TestClient,
                                                        artifact: Artifact) -> None:
    upload(client, artifact.card)
    status, body = publish(client, artifact, blobs=False)
    assert status == 422 and "ONNX graph blob" in body["error"]
    assert "PUT /v1/blobs" in body["hint"]
    assert client.get("/v1/models/fmnist-small/versions").status_code == 404


def test_unsigned_untrusted_and_forged_manifests_are_refused(
        client: TestClient, artifact: Artifact, other_key: Ed25519PrivateKey) -> None:
    for signed, reason in (
            (replace(artifact.signed, signature=""), "unsigned"),
            (sign_manifest(artifact.manifest, other_key), "not trusted"),
            (replace(artifact.signed, manifest=replace(artifact.manifest, notes="x")),
             "bad signature")):
        status, body = publish(client, replace(artifact, signed=signed))
        assert status == 422 and reason in body["error"], body
    assert client.get("/v1/models").json() == {"models": []}


def test_malformed_bodies_and_names(client: TestClient, artifact: Artifact) -> None:
    answer = client.post("/v1/models/fmnist-small/versions", content=b"{not json")
    assert answer.status_code == 422 and "not JSON" in answer.json()["error"]
    answer = client.post("/v1/models/fmnist-small/versions", json={"manifest": {}})
    assert answer.status_code == 422 and "manifest" in answer.json()["error"]
    answer = client.post("/v1/models/fmnist-large/versions", json=artifact.signed.to_dict())
    assert answer.status_code == 400 and "posted under 'fmnist-large'" in answer.json()["error"]
    assert client.get("/v1/models/fmnist-small/versions/2").status_code == 404


def test_with_no_trusted_publishers_any_self_consistent_signature_is_accepted(
        tmp_path: Path, other_key: Ed25519PrivateKey, artifact: Artifact) -> None:
    app = repo_app(tmp_path / "open")
    with TestClient(app) as client:
        unsigned = replace(artifact, signed=replace(artifact.signed, signature=""))
        assert publish(client, unsigned)[0] == 422
        status, body = publish(client, artifact)
        assert status == 201 and body["key_id"] == artifact.signed.key_id
    app.state.repository.versions.close()
