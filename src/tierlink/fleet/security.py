"""A local fleet's PKI: the fleet CA, the control plane's server certificate and an
operator's client certificate, made in the run directory when the fleet file asks for TLS
(``security: {tls: true}``, ``tierlink up --tls``).

Nodes get theirs from the control plane at enrollment (node/certificates.py). The
operator's pair is what `tierlink up` itself, its benchmarks and tests present where a
node asks for an operator (fault injection) and what they verify the fleet with.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from tierlink.security.pki import CA_CERT, CA_KEY, Authority, CertIdentity, write_file
from tierlink.security.tls import TlsFiles, client_context
from tierlink.settings.security import SecurityConfig

_SERVICE_TTL_S = 365 * 86_400.0  # the launcher's own pairs: the fleet outlives no year


@dataclass(frozen=True, slots=True)
class FleetPki:
    ca_dir: Path
    control: TlsFiles  # the control plane's server certificate
    operator: TlsFiles  # an operator's client certificate
    client_auth: str = "optional"
    cert_ttl_s: float = 86_400.0

    @property
    def ca_file(self) -> Path:
        return self.ca_dir / CA_CERT

    def client_context(self, *, operator: bool = True) -> ssl.SSLContext:
        """What a caller of this fleet verifies it with (and, by default, presents the
        operator's certificate with)."""
        return client_context(self.operator if operator else TlsFiles(self.ca_file))


def prepare_pki(security: SecurityConfig, run_dir: Path, hosts: tuple[str, ...],
                now: float | None = None) -> FleetPki | None:
    """The fleet's PKI under ``run_dir/pki`` (the CA: ``security.ca_dir`` or one made
    there once); None without TLS."""
    if not security.tls:
        return None
    now = time.time() if now is None else now
    ca_dir = Path(security.ca_dir) if security.ca_dir else run_dir / "pki"
    if not (ca_dir / CA_KEY).exists():
        Authority.create(run_dir.name, now).save(ca_dir)
    ca = Authority.load(ca_dir)
    folder = run_dir / "pki"
    control = _pair(ca, ca_dir / CA_CERT, CertIdentity("control", "control"), hosts,
                    folder / "control", now)
    operator = _pair(ca, ca_dir / CA_CERT, CertIdentity("operator", "tierlink-up"), (),
                     folder / "operator", now)
    return FleetPki(ca_dir, control, operator, security.client_auth, security.cert_ttl_s)


def _pair(ca: Authority, ca_file: Path, identity: CertIdentity, hosts: tuple[str, ...],
          stem: Path, now: float) -> TlsFiles:
    key, issued = ca.issue_pair(identity, hosts, now, _SERVICE_TTL_S)
    stem.parent.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = stem.with_suffix(".pem"), stem.with_suffix(".key")
    write_file(key_file, key, 0o600)
    write_file(cert_file, issued.cert_pem, 0o644)
    return TlsFiles(ca_file, cert_file, key_file)
