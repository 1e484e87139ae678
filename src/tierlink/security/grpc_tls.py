"""TLS for the protocol's gRPC API: the node's server credentials (following its certificate
as it renews), a client's channel credentials, and who called, from the same PEM files as
the REST stack's contexts (``security/tls.py``).

gRPC's Python API has two client-certificate modes where the REST server has
``optional`` and ``required``: with ``required`` the server asks every caller for a
certificate the fleet CA issued and refuses a handshake without one, so the caller's
identity (the certificate's ``urn:tierlink:`` name) binds its claims as over REST; with
``optional`` it asks for none, and every gRPC caller is an application (it may name no
origin and carry no hops — ``security/claims.py``). Nodes relay to each other over REST,
where an optional certificate is asked for, so that loses nothing a node does.

Certificates rotate without a restart: the server credentials are *dynamic* — gRPC asks
for the current pair at each new connection's handshake, and gets the renewed one once the
node's keeper has written it (connections already open keep theirs until they close).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from tierlink.errors import ConfigError
from tierlink.security.asgi_tls import peer_identity
from tierlink.security.pki import CertIdentity
from tierlink.security.tls import TlsFiles, require_pair

__all__ = ["channel_credentials", "peer_of_call", "server_credentials"]


def server_credentials(files: TlsFiles, client_auth: str,
                       generation: Callable[[], int]) -> grpc.ServerCredentials:
    """Credentials for a gRPC server presenting ``files``' pair; read again at a handshake
    whenever ``generation()`` (the keeper's count of renewals) has moved on."""
    loaded = [generation()]

    def fetch() -> Any:
        now = generation()
        if now == loaded[0]:
            return None  # gRPC keeps the configuration it has
        loaded[0] = now
        return _configuration(files)

    return grpc.dynamic_ssl_server_credentials(
        _configuration(files), fetch, require_client_authentication=client_auth == "required")


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """A client's credentials: trust the fleet CA, present ``files``' pair where it has one."""
    pair = (_read(files.key), _read(files.cert)) if files.has_pair else (None, None)
    return grpc.ssl_channel_credentials(_read(files.ca), *pair)


def peer_of_call(context: grpc.aio.ServicerContext) -> CertIdentity | None:
    """The caller's verified identity (None: no certificate — always so unless the server
    requires one, see the module)."""
    pem = context.auth_context().get("x509_pem_cert")
    return peer_identity(pem[0]) if pem else None


def _configuration(files: TlsFiles) -> Any:
    require_pair(files)
    return grpc.ssl_server_certificate_configuration(
        [(_read(files.key), _read(files.cert))], root_certificates=_read(files.ca))


def _read(path: Any) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}",
                          hint="check the fleet's TLS files (`tierlink pki`)") from exc
