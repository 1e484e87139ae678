"""The model repository's HTTP routes, installed on the control plane's app.

    PUT  /v1/blobs/{sha256}                       raw body, streamed to disk; 201 new, 200
                                                  already stored, 422 when it does not hash
                                                  to {sha256}: {"sha256", "size", "created"}
    GET  /v1/blobs/{sha256}  (and HEAD)           the bytes; 404 when not stored
    POST /v1/models/{name}/versions               a SignedManifest as JSON; 201 published,
                                                  200 the identical one again, 409 another
                                                  one under that version, 422 missing blob /
                                                  bad hash / bad or untrusted signature
    GET  /v1/models                               {"models": [{"name", "task", "latest",
                                                  "versions": [entry...]}]}
    GET  /v1/models/{name}/versions               {"name", "versions": [entry...]}, 404 if none
    GET  /v1/models/{name}/versions/{version}     one entry: {"name", "version", "task",
                                                  "published_at", "key_id", "signed"}

Errors are raised as :mod:`tierlink.errors` exceptions; the app's ``TierlinkError`` handler
turns them into ``{"error", "code", "hint"}`` JSON with their ``http_status``.
"""

from __future__ import annotations

import asyncio
from typing import Any

# The web adapter: importing it means serving, so fastapi is imported here.
from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, JSONResponse

from tierlink.repo.blobs import check_sha
from tierlink.repo.service import RepositoryService
from tierlink.transport.openapi import BYTES, request_body

SIGNED_MANIFEST = {  # tierlink.repo.manifest.SignedManifest.to_dict()
    "type": "object", "required": ["manifest", "key_id", "signature"],
    "properties": {"manifest": {"type": "object", "description": "the version's manifest"},
                   "key_id": {"type": "string"},
                   "signature": {"type": "string", "description": "base64 ed25519"},
                   "public_key": {"type": "string", "description": "ed25519:<base64>"}}}

def install_repository_routes(app: FastAPI, service: RepositoryService) -> None:
    """Add the repository's routes to ``app`` and keep ``service`` on
    ``app.state.repository``. The app must turn ``TierlinkError`` into JSON (the control
    plane's does)."""
    app.state.repository = service
    _blob_routes(app, service)
    _model_routes(app, service)


def _blob_routes(app: FastAPI, service: RepositoryService) -> None:
    @app.put("/v1/blobs/{sha256}", openapi_extra=request_body(
        BYTES, media_type="application/octet-stream"))
    async def put_blob(sha256: str, request: Request) -> Response:
        check_sha(sha256)  # before reading a byte of the body
        size, created = await service.put_blob(sha256, request.stream())
        return JSONResponse({"sha256": sha256, "size": size, "created": created},
                            status_code=201 if created else 200)

    # Plain `def`: FastAPI runs it on a worker thread (a stat call), off the event loop.
    @app.get("/v1/blobs/{sha256}", operation_id="get_blob")
    @app.head("/v1/blobs/{sha256}", operation_id="head_blob")
    def get_blob(sha256: str) -> Response:
        return FileResponse(service.blob_path(sha256), media_type="application/octet-stream",
                            headers={"X-Tierlink-Sha256": sha256})


def _model_routes(app: FastAPI, service: RepositoryService) -> None:
    @app.post("/v1/models/{name}/versions", openapi_extra=request_body(SIGNED_MANIFEST))
    async def publish(name: str, request: Request) -> Response:
        body = await request.body()
        # Hashing the blobs and SQLite: off the event loop.
        entry, created = await asyncio.to_thread(service.publish, name, body)
        return JSONResponse({**entry.to_dict(), "created": created},
                            status_code=201 if created else 200)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"models": service.models()}

    @app.get("/v1/models/{name}/versions")
    def versions(name: str) -> dict[str, Any]:
        return {"name": name, "versions": [e.to_dict() for e in service.versions_of(name)]}

    @app.get("/v1/models/{name}/versions/{version}")
    def version(name: str, version: str) -> dict[str, Any]:
        return service.version(name, version).to_dict()
