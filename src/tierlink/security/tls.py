"""TLS contexts for a fleet's processes, built from PEM files, reloadable in place.

A server context verifies a presented client certificate against the fleet CA
(``optional``: applications without one still connect, and are treated as anonymous;
``required``: every caller needs one — mutual TLS for everything). A client context
verifies the server against the fleet CA (host names and IPs checked) and presents its own
certificate where it has one: that is how a node proves itself to its peers.

Certificates rotate without a restart: :func:`reload` loads the new pair into the very
context objects the servers and clients hold, so every connection made afterwards
presents the new certificate; connections already open keep theirs until they close.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from tierlink.errors import ConfigError

CLIENT_AUTH = ("optional", "required")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where a process's fleet CA, certificate and key are (cert/key may be absent for a
    client that only verifies servers)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    @property
    def has_pair(self) -> bool:
        return self.cert is not None and self.key is not None


def server_context(files: TlsFiles, client_auth: str = "optional") -> ssl.SSLContext:
    if client_auth not in CLIENT_AUTH:
        raise ConfigError(f"tls client_auth must be one of {CLIENT_AUTH}, not {client_auth!r}")
    require_pair(files)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _trust(ctx, files.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
    reload([ctx], files)
    return ctx


def require_pair(files: TlsFiles) -> None:
    """A TLS server (REST's context, gRPC's credentials) needs a certificate and its key."""
    if not files.has_pair:
        raise ConfigError("a TLS server needs a certificate and its key",
                          hint="nodes get theirs at enrollment; others from `tierlink pki issue`")


def client_context(files: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the server and its host name
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _trust(ctx, files.ca)
    if files.has_pair:
        reload([ctx], files)
    return ctx


def reload(contexts: list[ssl.SSLContext], files: TlsFiles) -> None:
    """Load ``files``' certificate and key into each context (new connections use them)."""
    for ctx in contexts:
        try:
            ctx.load_cert_chain(str(files.cert), str(files.key))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the certificate {files.cert} / key {files.key}: "
                              f"{exc}", hint="reissue it: `tierlink pki issue`, or let the "
                                             "node renew it") from exc


def _trust(ctx: ssl.SSLContext, ca: Path) -> None:
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot read the fleet CA {ca}: {exc}",
                          hint="make one with `tierlink pki init DIR`") from exc
