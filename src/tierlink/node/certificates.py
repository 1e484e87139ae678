"""A node's TLS: the contexts its server and clients hold, and the certificate behind them,
renewed before it expires without a restart.

A node of a fleet with TLS (``NodeSpec.tls_ca``) verifies every server it calls against the
fleet CA and presents its own certificate to its peers (mutual TLS: that is how a receiver
knows which node sent a request, see security/claims.py). Its certificate comes from the
control plane (``POST /v1/certificate``, authorized by the node's enrolled credential) and
lives in ``<state_dir>/tls/`` — or from the spec's ``tls_cert``/``tls_key`` where an
operator manages it (never renewed here).

Rotation: at two thirds of a certificate's life the keeper makes a new key, asks for a new
certificate, writes both and loads them into the *same* context objects the server and the
clients hold: every connection made afterwards presents the new certificate, connections
already open finish with the old one, and no request is dropped. A failed renewal is
retried (every tenth of the time left, at most 30 s) while the old certificate still holds.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from tierlink.errors import ConfigError, TierlinkError
from tierlink.node.spec import NodeSpec
from tierlink.security import pki
from tierlink.security.tls import TlsFiles, client_context, reload, server_context

log = logging.getLogger("tierlink.node.tls")

RENEW_AT = 2 / 3  # of a certificate's lifetime


class CertificateSource(Protocol):
    async def certificate(self, csr: bytes) -> dict[str, Any]: ...


class NodeTls:
    """The node's TLS contexts (``server``, ``client``) and its certificate's keeper."""

    def __init__(self, spec: NodeSpec, clock: Callable[[], float] = time.time) -> None:
        if not spec.tls_ca:
            raise ConfigError(f"node {spec.node_id} has no fleet CA (tls_ca)")
        ca = Path(spec.tls_ca)
        self.managed = spec.tls_cert is None  # renewed here (else the operator's files)
        folder = Path(spec.state_dir or ".") / "tls"
        self.files = (TlsFiles(ca, folder / "node.pem", folder / "node.key") if self.managed
                      else TlsFiles(ca, Path(str(spec.tls_cert)), Path(str(spec.tls_key))))
        self.client = client_context(TlsFiles(ca))  # the node's pair joins once it has one
        self._server: ssl.SSLContext | None = None
        self._client_auth = spec.tls_client_auth
        self._hosts = _hosts(spec)
        self._clock = clock
        self.renewals = 0
        self.failures = 0
        self.facts: dict[str, Any] = {}  # pki.describe of the loaded certificate

    @property
    def server(self) -> ssl.SSLContext:
        if self._server is None:
            raise ConfigError("the node's certificate is not loaded yet (call ensure first)")
        return self._server

    async def ensure(self, source: CertificateSource | None) -> None:
        """Load the node's certificate, getting a new one first when there is none, it
        does not load, or it is past its renewal time."""
        if self.managed and (source is not None) and not self._usable():
            await self._renew(source)
        reload([self.client], self.files)
        if self._server is None:
            self._server = server_context(self.files, self._client_auth)
        self._read_facts()

    async def run(self, source: CertificateSource) -> None:
        """Renew forever (a task the node cancels when it stops)."""
        while self.managed:
            await asyncio.sleep(max(0.05, self._renew_at() - self._clock()))
            try:
                await self._renew(source)
                reload([self.client, self.server], self.files)
                self._read_facts()
                self.renewals += 1
                log.info("certificate renewed (serial %s, valid until %s)", self.facts["serial"],
                         time.strftime("%H:%M:%S", time.localtime(self._not_after())))
            except (TierlinkError, OSError, ssl.SSLError) as exc:
                self.failures += 1
                wait = min(30.0, max(0.5, (self._not_after() - self._clock()) / 10))
                log.warning("certificate renewal failed (%s); retrying in %.1f s", exc, wait)
                await asyncio.sleep(wait)

    def grpc_credentials(self) -> Any:
        """The gRPC API's server credentials: this node's pair, followed as it renews
        (``security/grpc_tls.py``)."""
        from tierlink.security.grpc_tls import server_credentials

        return server_credentials(self.files, self._client_auth, lambda: self.renewals)

    def status(self) -> dict[str, object]:
        return {**self.facts, "managed": self.managed, "renewals": self.renewals,
                "renewal_failures": self.failures, "client_auth": self._client_auth}

    async def _renew(self, source: CertificateSource) -> None:
        key = pki.new_key()
        answer = await source.certificate(pki.csr_pem(key, self._hosts))
        assert self.files.cert is not None and self.files.key is not None  # managed: ours
        self.files.cert.parent.mkdir(parents=True, exist_ok=True)
        pki.write_file(self.files.key, pki.key_pem(key), 0o600)
        pki.write_file(self.files.cert, str(answer["certificate"]).encode(), 0o644)

    def _usable(self) -> bool:
        try:
            self._read_facts()
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(str(self.files.cert),
                                                                    str(self.files.key))
        except (OSError, ValueError, ssl.SSLError):
            return False
        return self._clock() < self._renew_at()

    def _read_facts(self) -> None:
        assert self.files.cert is not None
        self.facts = pki.describe(self.files.cert.read_bytes())

    def _not_after(self) -> float:
        return float(self.facts.get("not_after", 0.0))

    def _renew_at(self) -> float:
        start = float(self.facts.get("not_before", 0.0))
        return start + RENEW_AT * (self._not_after() - start)


def _hosts(spec: NodeSpec) -> tuple[str, ...]:
    """The names the node's certificate must hold: where peers reach it."""
    hosts = ["localhost"]
    if spec.host not in ("0.0.0.0", "::", ""):
        hosts.append(spec.host)
    if spec.advertise_url:
        hosts.append(urlsplit(spec.advertise_url).hostname or "")
    return tuple(h for h in dict.fromkeys(hosts) if h)
