"""Helpers for the model repository tests: a fake clock, artifacts on disk (signed)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tierlink.repo.manifest import SignedManifest, Validation, VersionManifest
from tierlink.repo.publish import prepare_version
from tierlink.repo.signing import sign_manifest

NOW = 1_733_140_000.0
CARD: dict[str, Any] = {"task": "fmnist", "name": "fmnist-small", "variant": "small",
                        "version": "1", "tier": "device", "sha256": "0" * 64,
                        "test_accuracy": 0.92}


class FakeClock:
    """Epoch seconds that only move when a test advances them."""

    def __init__(self, start: float = NOW) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass(frozen=True)
class Artifact:
    """A version's two files on disk and its signed manifest."""

    onnx: Path
    card: Path
    signed: SignedManifest

    @property
    def manifest(self) -> VersionManifest:
        return self.signed.manifest


def validation(accuracy: float = 0.9125) -> Validation:
    return Validation(dataset="fmnist", split="test", n=800, accuracy=accuracy,
                      measured_at=NOW - 5)


def make_artifact(tmp: Path, key: Ed25519PrivateKey, *, name: str = "fmnist-small",
                  version: str = "2", graph: bytes = b"\x08\x07fake onnx graph" * 64,
                  notes: str = "retrained") -> Artifact:
    """Files under ``tmp`` (a fresh directory per artifact) and their signed manifest."""
    tmp.mkdir(parents=True, exist_ok=True)
    onnx = tmp / "src.onnx"
    onnx.write_bytes(graph)
    source_card = tmp / "src.json"
    source_card.write_text(json.dumps(CARD))
    manifest, onnx_path, card_path = prepare_version(name, onnx, source_card, version, notes,
                                                     tmp / "out", validation(),
                                                     clock=lambda: NOW)
    return Artifact(onnx_path, card_path, sign_manifest(manifest, key))


def repo_app(root: Path, trusted: tuple[str, ...] = (), clock: Any = None) -> Any:
    """A bare FastAPI app with the repository routes and the control plane's kind of
    error handler (TierlinkError -> its JSON body and status)."""
    from fastapi import FastAPI, Request, Response
    from fastapi.responses import JSONResponse

    from tierlink.errors import TierlinkError
    from tierlink.repo.blobs import BlobStore
    from tierlink.repo.routes import install_repository_routes
    from tierlink.repo.service import RepositoryService
    from tierlink.repo.store import SqliteVersionStore

    app = FastAPI()
    root.mkdir(parents=True, exist_ok=True)

    @app.exception_handler(TierlinkError)
    async def tierlink_error(_request: Request, exc: TierlinkError) -> Response:
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)

    service = RepositoryService(SqliteVersionStore(root / "control.db"),
                                BlobStore(root / "blobs"), trusted,
                                clock if clock is not None else FakeClock())
    install_repository_routes(app, service)
    return app
