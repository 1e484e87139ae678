"""The repository clients: the CLI's sync client and the nodes' fetch_artifact."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from repo_support import Artifact, FakeClock, make_artifact, repo_app
from tierlink.errors import ArtifactRejected, ControlPlaneError, RepositoryError, VersionConflict
from tierlink.repo.client import RepositoryClient, fetch_artifact
from tierlink.repo.verify import verify_artifact

URL = "http://control"


@pytest.fixture
def app(tmp_path: Path, public: str, clock: FakeClock) -> Iterator[Any]:
    app = repo_app(tmp_path / "control", (public,), clock)
    yield app
    app.state.repository.versions.close()


@pytest.fixture
def repo(app: Any) -> Iterator[RepositoryClient]:
    with TestClient(app) as http, RepositoryClient(URL, http=http) as client:
        yield client


def published(repo: RepositoryClient, artifact: Artifact) -> dict[str, Any]:
    repo.upload_blob(artifact.onnx)
    repo.upload_blob(artifact.card)
    return repo.publish(artifact.signed)


def test_upload_publish_list_get(repo: RepositoryClient, artifact: Artifact) -> None:
    first = repo.upload_blob(artifact.onnx)
    assert first == {"sha256": artifact.manifest.onnx_sha256,
                     "size": artifact.manifest.onnx_size, "created": True}
    assert repo.upload_blob(artifact.onnx)["created"] is False
    assert published(repo, artifact)["created"] is True
    assert published(repo, artifact)["created"] is False
    [entry] = repo.list_versions()
    assert entry.signed == artifact.signed
    assert repo.list_versions("fmnist-small") == [entry]
    assert repo.get("fmnist-small", "2") == entry


def test_error_answers_become_tierlink_errors(repo: RepositoryClient, artifact: Artifact,
                                              tmp_path: Path, key: Ed25519PrivateKey) -> None:
    with pytest.raises(RepositoryError, match="not published") as info:
        repo.get("fmnist-small", "2")
    assert info.value.hint  # the server's hint travels
    with pytest.raises(ArtifactRejected, match="ONNX graph blob"):
        repo.publish(artifact.signed)
    published(repo, artifact)
    with pytest.raises(VersionConflict):
        published(repo, make_artifact(tmp_path / "b", key, graph=b"other"))
    with pytest.raises(ArtifactRejected, match="unsigned"):
        repo.publish(replace(artifact.signed, signature=""))


def test_an_unreachable_repository_is_a_control_plane_error() -> None:
    with socket.socket() as s:  # bound, not listening: refused, and no one else can take it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with RepositoryClient(f"http://127.0.0.1:{port}", timeout_s=2) as client, \
                pytest.raises(ControlPlaneError, match="cannot reach the repository"):
            client.list_versions()


def _fetch(app: Any, artifact: Artifact, dest: Path) -> tuple[Path, Path]:
    async def run() -> tuple[Path, Path]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app)) as http:
            return await fetch_artifact(URL, artifact.signed, dest, http)
    return asyncio.run(run())


def test_fetch_artifact_downloads_verified_files(app: Any, repo: RepositoryClient,
                                                 artifact: Artifact, public: str,
                                                 tmp_path: Path) -> None:
    published(repo, artifact)
    dest = tmp_path / "slot-B"
    dest.mkdir()
    onnx, card = _fetch(app, artifact, dest)
    assert (onnx, card) == (dest / "model.onnx", dest / "card.json")
    assert verify_artifact(artifact.signed, onnx, card, [public]) == artifact.signed.key_id
    assert sorted(p.name for p in dest.iterdir()) == ["card.json", "model.onnx"]


def test_fetch_artifact_refuses_a_corrupt_copy_and_leaves_nothing(
        app: Any, repo: RepositoryClient, artifact: Artifact, tmp_path: Path) -> None:
    published(repo, artifact)
    stored = app.state.repository.blobs.path(artifact.manifest.onnx_sha256)
    stored.write_bytes(stored.read_bytes()[:-3] + b"bad")  # rot on the repository's disk
    dest = tmp_path / "slot-B"
    dest.mkdir()
    with pytest.raises(ArtifactRejected, match="downloaded ONNX graph .* does not match"):
        _fetch(app, artifact, dest)
    assert list(dest.iterdir()) == []


def test_fetch_artifact_of_a_missing_blob_is_a_404(app: Any, artifact: Artifact,
                                                   tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="not in the repository"):
        _fetch(app, artifact, tmp_path)
    assert not (tmp_path / "model.onnx.part").exists()
