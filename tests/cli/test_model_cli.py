"""``tierlink model keygen|publish|list|show`` against an in-process repository."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tierlink.cli import model
from tierlink.cli.errors import admin_headers
from tierlink.control.app import create_app
from tierlink.control.identity import IdentityStore
from tierlink.control.store import SqliteRegistryStore
from tierlink.repo.blobs import BlobStore
from tierlink.repo.client import RepositoryClient
from tierlink.repo.routes import install_repository_routes
from tierlink.repo.service import RepositoryService
from tierlink.repo.store import SqliteVersionStore

URL = "http://control"
ADMIN_TOKEN = "operator-token-0123456789"
runner = CliRunner()


def cli() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(model.app, name="model")
    return root


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FastAPI]:
    """The real control plane app (with node identity: publishing needs the admin token)
    and the repository routes installed on it, as the control plane will."""
    db = tmp_path / "control.db"
    registry = SqliteRegistryStore(db)
    identity = IdentityStore(db, ADMIN_TOKEN)
    versions = SqliteVersionStore(db)
    app = create_app(registry, identity=identity)
    install_repository_routes(app, RepositoryService(versions, BlobStore(tmp_path / "blobs")))
    with TestClient(app) as http:
        monkeypatch.setattr(model, "_client", lambda url, token: RepositoryClient(
            url, headers=admin_headers(token), http=http))
        yield app
    versions.close()
    identity.close()
    registry.close()


@pytest.fixture(scope="module")
def zoo_model() -> tuple[Path, Path]:
    from tierlink.zoo.cache import ensure_zoo, zoo_dir

    full = zoo_dir("full")
    if (full / "fmnist-small.onnx").is_file() and (full / "fmnist-small.json").is_file():
        return full / "fmnist-small.onnx", full / "fmnist-small.json"
    zoo = ensure_zoo(profile="test", progress=False)
    return zoo.path("fmnist-small"), zoo.card_path("fmnist-small")


def invoke(*args: str, token: str | None = ADMIN_TOKEN) -> Any:
    env = {"COLUMNS": "200", "TIERLINK_ADMIN_TOKEN": token or ""}
    return runner.invoke(cli(), ["model", *args], env=env)


def test_keygen_prints_the_public_key_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "k.pem"
    result = invoke("keygen", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().startswith("ed25519:")
    again = invoke("keygen", "--out", str(out))
    assert again.exit_code == 2 and "already exists" in " ".join(again.output.split())


def test_publish_list_show(control: FastAPI, zoo_model: tuple[Path, Path],
                           tmp_path: Path) -> None:
    onnx, card = zoo_model
    key = tmp_path / "k.pem"
    assert invoke("keygen", "--out", str(key)).exit_code == 0
    args = ["publish", "fmnist-small", str(onnx), "--card", str(card), "--version", "2",
            "--notes", "retrained on more data", "--key", str(key), "--control", URL,
            "--eval-limit", "300"]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)
    assert entry["created"] is True and entry["version"] == "2"
    assert entry["signed"]["manifest"]["validation"]["n"] == 300
    again = invoke(*args)  # a re-run: the same files, other timestamps: a no-op
    assert again.exit_code == 0 and "already published" in again.stdout
    other = invoke(*[a if a != "retrained on more data" else "other notes" for a in args])
    assert other.exit_code == 2 and "already published with other" in other.output
    listed = invoke("list", "--control", URL, "--json")
    assert [e["version"] for e in json.loads(listed.stdout)] == ["2"]
    table = invoke("list", "fmnist-small", "--control", URL)
    assert table.exit_code == 0 and "(latest)" in table.stdout
    shown = invoke("show", "fmnist-small", "2", "--control", URL)
    assert shown.exit_code == 0 and "retrained on more data" in shown.stdout
    assert entry["signed"]["manifest"]["onnx_sha256"] in shown.stdout


def test_errors_exit_2_with_message_and_hint(control: FastAPI, tmp_path: Path) -> None:
    result = invoke("show", "fmnist-small", "9", "--control", URL)
    assert result.exit_code == 2 and "not published" in result.output
    assert "hint" in result.output
    missing = invoke("publish", "fmnist-small", str(tmp_path / "x.onnx"), "--card",
                     str(tmp_path / "x.json"), "--version", "2", "--notes", "n", "--key",
                     str(tmp_path / "none.pem"), "--control", URL)
    assert missing.exit_code == 2 and "cannot read key file" in " ".join(missing.output.split())


def test_publishing_needs_the_admin_token(control: FastAPI, zoo_model: tuple[Path, Path],
                                         tmp_path: Path) -> None:
    onnx, card = zoo_model
    key = tmp_path / "k.pem"
    assert invoke("keygen", "--out", str(key)).exit_code == 0
    args = ["publish", "fmnist-small", str(onnx), "--card", str(card), "--version", "2",
            "--notes", "n", "--key", str(key), "--control", URL, "--eval-limit", "100"]
    anonymous = invoke(*args, token=None)
    assert anonymous.exit_code == 2 and "needs credentials" in anonymous.output
    wrong = invoke(*args, token="not-the-operator-token")
    assert wrong.exit_code == 2, wrong.output
    assert invoke("list", "--control", URL, "--json").stdout.strip() == "[]"
    assert invoke(*args, "--admin-token", ADMIN_TOKEN, token=None).exit_code == 0
