"""What the operator commands share (``tierlink rollout``, ``tierlink policy``): the control
plane's address and the admin token as options, and one call to the control plane as an
operator, whose error answers come back as the :mod:`tierlink.errors` they were."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from tierlink.cli.errors import ADMIN_TOKEN_HELP, admin_headers, fleet_verify
from tierlink.errors import ControlPlaneError

if TYPE_CHECKING:
    import httpx

__all__ = ["AdminToken", "ControlUrl", "call", "http_client"]

DEFAULT_URL = "http://127.0.0.1:7000"
ControlUrl = typer.Option(DEFAULT_URL, "--control-url", "--control",
                          envvar="TIERLINK_CONTROL_URL", help="control plane URL")
AdminToken = typer.Option(None, "--admin-token", envvar="TIERLINK_ADMIN_TOKEN",
                          help=ADMIN_TOKEN_HELP)


@contextmanager
def http_client(url: str) -> Iterator[httpx.Client]:
    """A client for the control plane at ``url`` (tests replace this with a TestClient)."""
    import httpx

    with httpx.Client(base_url=url.rstrip("/"), timeout=10.0, trust_env=False,
                      verify=fleet_verify()) as client:
        yield client


def call(url: str, token: str | None, method: str, path: str,
         body: dict[str, Any] | None = None, params: dict[str, str] | None = None) -> Any:
    """One call as an operator; a ``TierlinkError`` rebuilt from the answer on >= 400."""
    import httpx

    from tierlink.errors import error_from_dict

    try:
        with http_client(url) as client:
            response = client.request(method, path, headers=admin_headers(token), json=body,
                                      params=params)
    except httpx.HTTPError as exc:
        raise ControlPlaneError(f"cannot reach the control plane at {url}: {exc}") from exc
    try:
        answer = response.json()
    except ValueError:
        answer = {"error": response.text[:200] or f"HTTP {response.status_code}"}
    if response.status_code >= 400:
        raise error_from_dict(answer if isinstance(answer, dict) else {},
                              response.status_code)
    return answer
