"""The fleet's certificate authority and the certificates it issues (``cryptography``).

``tierlink pki init DIR`` makes the CA: ``DIR/ca.pem`` (public: every node and client
trusts it) and ``DIR/ca.key`` (mode 0600: only the control plane, which signs, reads it).
Keys are ECDSA P-256 — cheap handshakes, supported by every TLS stack.

Who a certificate names lives in one URI subject-alternative name, so a receiver reads it
without parsing free-text subjects::

    urn:tierlink:node:<tier>:<node_id>     a node (issued at enrollment, renewed by it)
    urn:tierlink:operator:<name>           an operator (fault injection, admin tools)
    urn:tierlink:client:<name>             an application
    urn:tierlink:control:<name>            a control-plane replica (its server certificate)

The CA never takes a name from a request: a node's certificate names the node its bearer
credential proved (see control/certificates.py); the CSR contributes its public key and
the addresses the node serves on (IP / DNS SANs), nothing else. A server's identity is
also written as a DNS name the CA alone assigns (``<node_id>.node.tierlink.internal``,
``control.tierlink.internal``: security/names.py), which callers verify instead of an
address; a request naming one of those is not copied.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tierlink.errors import ConfigError, InvalidRequest
from tierlink.security.names import identity_hosts, reserved

ROLES = ("node", "operator", "client", "control")
_PREFIX = "urn:tierlink:"
CA_CERT, CA_KEY = "ca.pem", "ca.key"


@dataclass(frozen=True, slots=True)
class CertIdentity:
    """Who a certificate names: a role, a name and (nodes) a tier."""

    role: str
    name: str
    tier: str | None = None

    def uri(self) -> str:
        middle = f"{self.tier}:" if self.role == "node" else ""
        return f"{_PREFIX}{self.role}:{middle}{self.name}"

    @classmethod
    def parse(cls, uri: str) -> CertIdentity | None:
        if not uri.startswith(_PREFIX):
            return None
        role, _, rest = uri[len(_PREFIX):].partition(":")
        if role == "node":
            tier, _, name = rest.partition(":")
            return cls(role, name, tier) if tier and name else None
        return cls(role, rest) if role in ROLES and rest else None

    def __str__(self) -> str:
        return f"{self.role} {self.name}" + (f" ({self.tier})" if self.tier else "")


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate as PEM, with the facts a keeper needs."""

    cert_pem: bytes
    serial: int
    not_before: float
    not_after: float


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError("expected an EC private key", hint="keys come from `tierlink pki`")
    return key


def csr_pem(key: ec.EllipticCurvePrivateKey, hosts: tuple[str, ...]) -> bytes:
    """A certificate signing request for ``key`` naming the addresses it serves on."""
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tierlink")]))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_host_names(hosts)),
                                        critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


class Authority:
    """The fleet CA: its certificate and (where it signs) its key."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> None:
        self.cert, self.key = cert, key

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def create(cls, name: str, now: float, ttl_days: float = 3650.0) -> Authority:
        key = new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"tierlink CA {name}")])
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(_utc(now - 60)).not_valid_after(_utc(now + ttl_days * 86400))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                             False, False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                               critical=False)
                .sign(key, hashes.SHA256()))
        return cls(cert, key)

    def save(self, directory: Path) -> None:
        """``ca.pem`` and ``ca.key`` (0600); refuses to overwrite an existing CA."""
        directory.mkdir(parents=True, exist_ok=True)
        if (directory / CA_KEY).exists() or (directory / CA_CERT).exists():
            raise ConfigError(f"{directory} already holds a CA",
                              hint="a fleet has one CA: reuse it, or choose another folder")
        if self.key is None:
            raise ConfigError("only a CA with its key can be saved")
        write_file(directory / CA_KEY, key_pem(self.key), 0o600)
        write_file(directory / CA_CERT, self.cert_pem, 0o644)

    @classmethod
    def load(cls, directory: Path, *, with_key: bool = True) -> Authority:
        try:
            cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
            key = load_key((directory / CA_KEY).read_bytes()) if with_key else None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"no usable fleet CA in {directory}: {exc}",
                              hint="make one with `tierlink pki init DIR`") from exc
        return cls(cert, key)

    def sign_csr(self, csr: bytes, identity: CertIdentity, now: float,
                 ttl_s: float) -> Issued:
        """A certificate for ``identity`` over the CSR's key and addresses. A CSR that
        cannot be read or whose signature fails is the caller's mistake (400)."""
        try:
            request = x509.load_pem_x509_csr(csr)
        except ValueError as exc:
            raise InvalidRequest(f"not a PEM certificate signing request: {exc}",
                                 hint="make one with tierlink.security.pki.csr_pem") from None
        if not request.is_signature_valid:
            raise InvalidRequest("the CSR's signature does not verify")
        public = request.public_key()
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise InvalidRequest("the CSR must carry an EC (P-256) public key")
        try:
            hosts = request.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            names = [n for n in hosts.value if isinstance(n, x509.IPAddress)
                     or (isinstance(n, x509.DNSName) and not reserved(n.value))]
        except x509.ExtensionNotFound:
            names = []
        return self._issue(public, identity, names, now, ttl_s)

    def issue_pair(self, identity: CertIdentity, hosts: tuple[str, ...], now: float,
                   ttl_s: float) -> tuple[bytes, Issued]:
        """A new key and its certificate (operators, clients, control-plane replicas)."""
        key = new_key()
        names = _host_names(tuple(h for h in hosts if not reserved(h)))
        return key_pem(key), self._issue(key.public_key(), identity, names, now, ttl_s)

    def _issue(self, public: ec.EllipticCurvePublicKey, identity: CertIdentity,
               names: Sequence[x509.GeneralName], now: float, ttl_s: float) -> Issued:
        if self.key is None:
            raise ConfigError("this CA has no key to sign with")
        try:  # the identity as a name callers verify (security/names.py)
            own = [x509.DNSName(h) for h in identity_hosts(identity.role, identity.name)]
        except ValueError as exc:
            raise InvalidRequest(str(exc), hint="rename the node") from None
        serial = x509.random_serial_number()
        # Backdated a little for clocks a bit behind ours; not much, or a short life's
        # renewal time (a share of not_before..not_after) would come late.
        start, end = now - min(60.0, ttl_s / 10), now + ttl_s
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                            identity.name[:64])]))
                .issuer_name(self.cert.subject).public_key(public).serial_number(serial)
                .not_valid_before(_utc(start)).not_valid_after(_utc(end))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName(
                    [x509.UniformResourceIdentifier(identity.uri()), *own, *names]),
                    critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self.key.public_key()), critical=False)
                .sign(self.key, hashes.SHA256()))
        return Issued(cert.public_bytes(serialization.Encoding.PEM), serial, start, end)


def identity_of(cert_der_or_pem: bytes) -> CertIdentity | None:
    """The tierlink identity a certificate names (None: it names none)."""
    try:
        cert = (x509.load_pem_x509_certificate(cert_der_or_pem)
                if cert_der_or_pem.lstrip().startswith(b"-----")
                else x509.load_der_x509_certificate(cert_der_or_pem))
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        found = CertIdentity.parse(uri)
        if found is not None:
            return found
    return None


def describe(cert_pem: bytes) -> dict[str, Any]:
    """What ``tierlink pki show`` and a node's status print of a certificate."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    identity = identity_of(cert_pem)
    return {"subject": cert.subject.rfc4514_string(), "identity": identity and identity.uri(),
            "serial": format(cert.serial_number, "x"),
            "not_before": cert.not_valid_before_utc.timestamp(),
            "not_after": cert.not_valid_after_utc.timestamp(),
            "issuer": cert.issuer.rfc4514_string()}


def _host_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _utc(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Atomically, with ``mode`` from the start (a key is never readable by others)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

