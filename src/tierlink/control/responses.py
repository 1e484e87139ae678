"""The control plane's error answers: ``{"error", "code", "hint"}`` JSON."""

from __future__ import annotations

from fastapi import Response
from fastapi.responses import JSONResponse


def unknown_node(node_id: str) -> Response:
    return error_response(404, f"node {node_id!r} is not registered (unknown, expired or deregistered)",
                  "node_not_found", "list the alive nodes with GET /v1/nodes")


def error_response(status: int, message: str, code: str, hint: str) -> Response:
    return JSONResponse({"error": message, "code": code, "hint": hint}, status_code=status)
