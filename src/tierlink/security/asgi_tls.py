"""Who is on the other end of a TLS connection, as the ASGI app sees it.

uvicorn does not put the client certificate in the request's scope, so the node's server
runs :class:`TlsHttpProtocol`: uvicorn's httptools protocol that reads the verified peer
certificate once per connection (after the handshake) and adds the ASGI TLS extension
to every request's scope — ``scope["extensions"]["tls"]`` with ``client_cert_chain``
(PEM strings, leaf first), ``client_cert_name``, ``tls_version`` and ``cipher_suite``.
:func:`peer_of` reads the tierlink identity from it (parsed once per certificate).

A certificate reaching the app was verified by the server's context against the fleet CA
(a certificate from anyone else fails the handshake), so its identity can be trusted.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tierlink.security.pki import CertIdentity, identity_of

_TLS_VERSIONS = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}


class TlsHttpProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol plus the ASGI TLS extension (see the module doc)."""

    _tls: dict[str, Any] | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        self._tls = None if ssl_object is None else _extension(ssl_object)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._tls is not None:
            self.scope["extensions"] = {"tls": self._tls}  # type: ignore[typeddict-unknown-key,dict-item]


def _extension(ssl_object: ssl.SSLObject) -> dict[str, Any]:
    der = ssl_object.getpeercert(binary_form=True)
    chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
    identity = peer_identity(der) if der else None
    return {"server_cert": None, "client_cert_chain": chain,
            "client_cert_name": identity.uri() if identity else None,
            "client_cert_error": None,
            "tls_version": _TLS_VERSIONS.get(ssl_object.version() or ""),
            "cipher_suite": None}


@functools.lru_cache(maxsize=1024)
def peer_identity(der: bytes) -> CertIdentity | None:
    return identity_of(der)


def peer_of(scope: Any) -> CertIdentity | None:
    """The sender's verified identity (None: no TLS, or no client certificate)."""
    tls = (scope.get("extensions") or {}).get("tls")
    if not tls or not tls.get("client_cert_name"):
        return None
    return CertIdentity.parse(tls["client_cert_name"])

