"""Who may call the control plane (middleware), and the identity endpoints: enrollment,
tokens, credentials, revocation (see :mod:`tierlink.control.identity`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from tierlink.control.identity import Identity, authorize
from tierlink.control.registry import RegistryService
from tierlink.control.responses import error_response
from tierlink.control.schemas import EnrollIn, TokenIn
from tierlink.errors import TierlinkError

log = logging.getLogger(__name__)


def install_auth(app: FastAPI, identity: Identity) -> None:
    """Every call is authorized before it reaches a route (``request.state.caller``: who
    made it); a refusal is the error's JSON (401 / 403). A plain ASGI middleware: no task
    or stream per call."""
    app.add_middleware(_Authenticated, identity=identity)


class _Authenticated:
    def __init__(self, app: Any, identity: Identity) -> None:
        self.app, self.identity = app, identity

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        header = headers.get(b"authorization")
        try:
            caller = await asyncio.to_thread(
                authorize, self.identity, scope["method"], scope["path"],
                None if header is None else header.decode("latin-1"))
        except TierlinkError as exc:
            await JSONResponse(exc.to_dict(), status_code=exc.http_status)(scope, receive, send)
            return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)


def install_identity_routes(app: FastAPI, identity: Identity,
                             service: RegistryService) -> None:
    @app.post("/v1/enroll")
    def enroll(body: EnrollIn) -> dict[str, Any]:
        secret = identity.enroll(body.token, body.node_id, body.tier, service.clock())
        log.info("node %s (%s) enrolled", body.node_id, body.tier)
        return {"node_id": body.node_id, "secret": secret}

    @app.post("/v1/enrollment-tokens", status_code=201)
    def create_token(body: TokenIn) -> dict[str, Any]:
        token = identity.create_token(service.clock(), ttl_s=body.ttl_s, uses=body.uses,
                                      note=body.note)
        return {"token": token, "ttl_s": body.ttl_s, "uses": body.uses, "note": body.note}

    @app.get("/v1/credentials")
    def credentials() -> dict[str, Any]:
        return {"nodes": [{"node_id": c.node_id, "tier": c.tier, "enrolled_at": c.enrolled_at,
                           "revoked_at": c.revoked_at} for c in identity.credentials()]}

    @app.post("/v1/credentials/{node_id}/revoke")
    def revoke(node_id: str) -> Any:
        if not identity.revoke(node_id, service.clock()):
            return error_response(404, f"node {node_id!r} is not enrolled or already revoked",
                          "node_not_found", "list them with GET /v1/credentials")
        service.deregister(node_id)  # nobody routes to it any more
        log.warning("node %s revoked", node_id)
        return {"node_id": node_id, "revoked": True}
