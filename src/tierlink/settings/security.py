"""The fleet file's ``security:`` section: TLS on every hop, with a fleet CA.

    security:
      tls: true                # a fleet CA (`tierlink up` makes one in the run directory,
                               # or uses ca_dir), HTTPS everywhere, node certificates
      client_auth: optional    # required: every caller needs a fleet certificate
      cert_ttl_s: 86400        # a node certificate's life; renewed at two thirds of it
      ca_dir: /etc/tierlink/ca # the fleet CA to use (`tierlink pki init`); default: a new one

On a fleet with TLS a request's origin and privacy claims are bound to the node that sent
it, the inbox takes deliveries from nodes only, and fault injection, link probes and
split opening need a node's or an operator's certificate (see security/claims.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tierlink.errors import ConfigError
from tierlink.settings.fields import as_bool, as_float, as_mapping, known

_KEYS = ("tls", "client_auth", "cert_ttl_s", "ca_dir")


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    tls: bool = False  # HTTPS on every hop, with a fleet CA and a certificate per node
    # optional: a caller without a fleet certificate connects as anonymous; required: none
    # connects without one (mutual TLS)
    client_auth: str = "optional"
    cert_ttl_s: float = 86_400.0  # seconds a node certificate is valid; renewed at 2/3 of it
    # the fleet CA's directory (`tierlink pki init`; a CA is made there if it has none);
    # left out: a new CA in the run directory
    ca_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``security:`` section."""
        out: dict[str, Any] = {"tls": self.tls, "client_auth": self.client_auth,
                               "cert_ttl_s": self.cert_ttl_s}
        return out | ({"ca_dir": self.ca_dir} if self.ca_dir else {})


def parse_security(raw: Any) -> SecurityConfig:
    data = as_mapping(raw, "security")
    for key in data:
        known(str(key), _KEYS, "security")
    client_auth = str(data.get("client_auth", "optional"))
    if client_auth not in ("optional", "required"):
        raise ConfigError(f"security.client_auth must be optional or required, got "
                          f"{client_auth!r}")
    return SecurityConfig(tls=as_bool(data.get("tls", False), "security.tls"),
                          client_auth=client_auth,
                          cert_ttl_s=as_float(data.get("cert_ttl_s", 86_400.0),
                                              "security.cert_ttl_s", 10.0),
                          ca_dir=str(data["ca_dir"]) if data.get("ca_dir") else None)
