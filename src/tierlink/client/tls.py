"""HTTPS to a fleet that runs TLS (``security: {tls: true}``): what an application's client
verifies and presents.

A fleet's certificates name identities, not addresses (``security/names.py``): the node an
application calls is verified as ``<node>.node.tierlink.internal`` and the control plane as
``control.tierlink.internal``, whatever the URL's address — so the client says which node it
means. An application presents a certificate of its own where the fleet asks for one
(``tierlink pki issue client NAME --ca CA_DIR --out NAME``: NAME.pem, NAME.key)::

    tls = ClientTLS(ca="run/pki/ca.pem", node="dev-1",
                    cert="alice.pem", key="alice.key")
    with tierlink.Client("https://127.0.0.1:8443", tls=tls) as node: ...
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tierlink.errors import ConfigError
from tierlink.security.names import CONTROL_HOST, node_host

__all__ = ["ClientTLS"]


@dataclass(frozen=True, slots=True)
class ClientTLS:
    """The fleet CA's certificate (``ca``), the id of the node the client calls (``node``:
    the name its certificate carries), and the application's own certificate and key."""

    ca: str | Path
    node: str
    cert: str | Path | None = None
    key: str | Path | None = None

    def context(self) -> ssl.SSLContext:
        """A client context that trusts the fleet CA alone (and presents ``cert``)."""
        if (self.cert is None) != (self.key is None):
            raise ConfigError("ClientTLS takes a certificate and its key together",
                              hint="both from `tierlink pki issue client NAME`")
        try:
            ctx = ssl.create_default_context(cafile=str(self.ca))
            if self.cert is not None:
                ctx.load_cert_chain(str(self.cert), str(self.key))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the fleet's TLS files: {exc}",
                              hint="the CA is in `tierlink up --json`'s `ca`; a certificate "
                                   "from `tierlink pki issue client NAME`") from exc
        return ctx

    def host_for(self, url: httpx.URL, node_url: str) -> str:
        """The identity a request to ``url`` must reach: the node for its own URL, the
        control plane for any other."""
        return node_host(self.node) if str(url).startswith(node_url) else CONTROL_HOST


def client_options(tls: ClientTLS | None, node_url: str, *,
                   asynchronous: bool = False) -> dict[str, Any]:
    """``httpx.Client`` (or, ``asynchronous``, ``httpx.AsyncClient``) options for ``tls``:
    the fleet CA's context and a request hook naming the identity each request must reach
    (none without ``tls``)."""
    if tls is None:
        return {}

    def named(request: httpx.Request) -> None:
        request.extensions["sni_hostname"] = tls.host_for(request.url, node_url)

    async def named_async(request: httpx.Request) -> None:
        named(request)

    hook: Callable[[httpx.Request], Any] = named_async if asynchronous else named
    return {"verify": tls.context(), "event_hooks": {"request": [hook]}}
