"""The signed repository as a catalog source: ``name@version`` installed into the layout
under ``$TIERLINK_HOME/repo`` once its files and signature check out, and checked again
each time it is resolved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from repo_support import Artifact, make_artifact, repo_app
from tierlink.control.repository_source import MANIFEST_FILE, RepositorySource, split_ref
from tierlink.errors import ArtifactRejected, ModelNotFound, RepositoryError
from tierlink.models.card import load_card
from tierlink.models.catalog import Catalog, SourceOptions
from tierlink.repo.client import RepositoryClient
from tierlink.repo.signing import public_key_string

URL = "http://control"


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def app(tmp_path: Path, key: Ed25519PrivateKey) -> Iterator[Any]:
    app = repo_app(tmp_path / "control", (public_key_string(key),))
    yield app
    app.state.repository.versions.close()


@pytest.fixture
def artifact(app: Any, tmp_path: Path, key: Ed25519PrivateKey) -> Artifact:
    artifact = make_artifact(tmp_path / "a", key)
    with TestClient(app) as http, RepositoryClient(URL, http=http) as client:
        client.upload_blob(artifact.onnx)
        client.upload_blob(artifact.card)
        client.publish(artifact.signed)
    return artifact


def source(app: Any, root: Path, keys: tuple[str, ...], url: str | None = URL
           ) -> RepositorySource:
    return RepositorySource(SourceOptions(repository=url, trusted_keys=keys), root,
                            transport=httpx.ASGITransport(app))


def test_a_published_version_is_installed_into_the_layout_and_resolved(
        app: Any, artifact: Artifact, key: Ed25519PrivateKey, tmp_path: Path) -> None:
    repo = source(app, tmp_path / "repo", (public_key_string(key),))
    assert repo.offers("fmnist-small@2") and not repo.offers("fmnist-small")
    found = Catalog([repo]).resolve(["fmnist-small@2"])["fmnist-small@2"]
    directory = tmp_path / "repo" / "fmnist-small" / "2"
    assert (found.file, found.card, found.source) == (directory / "model.onnx",
                                                      directory / "card.json", "repo")
    assert found.file.read_bytes() == artifact.onnx.read_bytes()
    assert load_card(found.card).version == "2"
    assert json.loads((directory / MANIFEST_FILE).read_text()) == artifact.signed.to_dict()
    # Installed: a plain name means it, and no repository is needed to resolve it again.
    offline = source(app, tmp_path / "repo", (), url=None)
    assert offline.offers("fmnist-small") and offline.names() == ["fmnist-small@2"]
    assert offline.resolve(["fmnist-small"])["fmnist-small"].file == found.file


def test_an_untrusted_signature_installs_nothing(app: Any, artifact: Artifact,
                                                 tmp_path: Path) -> None:
    other = public_key_string(Ed25519PrivateKey.generate())
    with pytest.raises(ArtifactRejected, match="not trusted|untrusted"):
        source(app, tmp_path / "repo", (other,)).resolve(["fmnist-small@2"])
    with pytest.raises(ArtifactRejected, match="TIERLINK_TRUSTED_KEYS"):
        source(app, tmp_path / "repo", ()).resolve(["fmnist-small@2"])
    assert not (tmp_path / "repo" / "fmnist-small").exists()


def test_a_changed_byte_of_an_installed_version_is_refused(
        app: Any, artifact: Artifact, key: Ed25519PrivateKey, tmp_path: Path) -> None:
    repo = source(app, tmp_path / "repo", (public_key_string(key),))
    found = repo.resolve(["fmnist-small@2"])["fmnist-small@2"]
    data = bytearray(found.file.read_bytes())
    data[0] ^= 1
    found.file.write_bytes(bytes(data))
    with pytest.raises(ArtifactRejected, match="model file"):
        repo.resolve(["fmnist-small@2"])


def test_unknown_versions_and_a_missing_repository_are_named(
        app: Any, artifact: Artifact, key: Ed25519PrivateKey, tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="not published"):
        source(app, tmp_path / "repo", (public_key_string(key),)).resolve(["fmnist-small@9"])
    offline = source(app, tmp_path / "repo", (public_key_string(key),), url=None)
    assert not offline.offers("fmnist-small@2")
    with pytest.raises(ModelNotFound, match="no version"):
        offline.resolve(["fmnist-small"])
    assert split_ref("a@b") == ("a", "b") and split_ref("a") == ("a", None)
