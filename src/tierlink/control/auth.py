"""Who may call the control plane (middleware), and the identity endpoints: enrollment,
tokens, credentials, revocation (see :mod:`tierlink.control.identity`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from tierlink.control.identity import Identity, authorize
from tierlink.control.registry import RegistryService
from tierlink.control.responses import error_response
from tierlink.control.schemas import EnrollIn, TokenIn
from tierlink.errors import TierlinkError

log = logging.getLogger(__name__)


def install_auth(app: FastAPI, identity: Identity) -> None:
    @app.middleware("http")
    async def authenticated(request: Request, call_next: Callable[[Request], Awaitable[Response]]
                            ) -> Response:
        try:
            request.state.caller = await asyncio.to_thread(
                authorize, identity, request.method, request.url.path,
                request.headers.get("authorization"))
        except TierlinkError as exc:
            return JSONResponse(exc.to_dict(), status_code=exc.http_status)
        return await call_next(request)


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
