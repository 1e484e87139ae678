"""The fleet CA: certificates name who the CA says, never who the CSR says; identities
round-trip through the URI SAN; a CA is never overwritten; bad CSRs are the caller's fault."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from tierlink.errors import ConfigError, InvalidRequest
from tierlink.security.pki import (
    Authority,
    CertIdentity,
    csr_pem,
    describe,
    identity_of,
    new_key,
)

NOW = 1_800_000_000.0


@pytest.mark.parametrize("identity", [CertIdentity("node", "dev-1", "device"),
                                      CertIdentity("node", "a:b", "edge"),
                                      CertIdentity("operator", "alice"),
                                      CertIdentity("client", "app-7"),
                                      CertIdentity("control", "control-1")])
def test_identities_round_trip_through_their_uri(identity: CertIdentity) -> None:
    assert CertIdentity.parse(identity.uri()) == identity


@pytest.mark.parametrize("uri", ["urn:other:node:edge:x", "urn:tierlink:node:edge",
                                 "urn:tierlink:wizard:x", "urn:tierlink:operator:"])
def test_foreign_or_partial_uris_name_nobody(uri: str) -> None:
    assert CertIdentity.parse(uri) is None


def test_a_node_certificate_names_the_node_the_ca_says_with_the_csr_s_addresses() -> None:
    ca = Authority.create("t", NOW)
    key = new_key()
    issued = ca.sign_csr(csr_pem(key, ("127.0.0.1", "edge.local")),
                         CertIdentity("node", "edge-1", "edge"), NOW, 3600.0)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    assert identity_of(issued.cert_pem) == CertIdentity("node", "edge-1", "edge")
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    # the identity as a name callers verify, then the CSR's own name
    assert sans.get_values_for_type(x509.DNSName) == ["edge-1.node.tierlink.internal",
                                                       "edge.local"]
    assert cert.public_key() == key.public_key()
    assert issued.not_after == NOW + 3600.0 and issued.not_before >= NOW - 60.0
    assert describe(issued.cert_pem)["identity"] == "urn:tierlink:node:edge:edge-1"
    cert.verify_directly_issued_by(ca.cert)


def test_nobody_gets_an_identity_name_by_asking_for_it() -> None:
    """A CSR (or a host list) naming another node's or the control plane's identity name
    does not get it: the CA writes only the one it vouches for."""
    ca = Authority.create("t", NOW)
    asked = ("edge-2.node.tierlink.internal", "CONTROL.tierlink.internal.", "10.0.0.9")
    issued = ca.sign_csr(csr_pem(new_key(), asked), CertIdentity("node", "dev-1", "device"),
                         NOW, 60.0)
    _, pair = ca.issue_pair(CertIdentity("client", "app"), asked, NOW, 60.0)
    for pem, own in ((issued.cert_pem, ["dev-1.node.tierlink.internal"]), (pair.cert_pem, [])):
        sans = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.DNSName) == own
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.9"]
    control = ca.issue_pair(CertIdentity("control", "c1"), ("127.0.0.1",), NOW, 60.0)[1]
    sans = x509.load_pem_x509_certificate(control.cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["control.tierlink.internal"]
    with pytest.raises(InvalidRequest, match="cannot be named"):
        ca.issue_pair(CertIdentity("node", "a..b", "edge"), (), NOW, 60.0)


def test_a_short_life_is_backdated_by_a_tenth_at_most() -> None:
    issued = Authority.create("t", NOW).issue_pair(CertIdentity("client", "c"), (), NOW, 10.0)[1]
    assert issued.not_before == NOW - 1.0


def test_csrs_that_cannot_be_trusted_are_refused() -> None:
    ca = Authority.create("t", NOW)
    with pytest.raises(InvalidRequest, match="not a PEM"):
        ca.sign_csr(b"-----BEGIN CERTIFICATE REQUEST-----\nxx\n", CertIdentity("client", "c"),
                    NOW, 60.0)


def test_a_ca_is_saved_private_and_never_overwritten(tmp_path: Path) -> None:
    Authority.create("t", NOW).save(tmp_path / "ca")
    assert stat.S_IMODE((tmp_path / "ca" / "ca.key").stat().st_mode) == 0o600
    with pytest.raises(ConfigError, match="already holds a CA"):
        Authority.create("u", NOW).save(tmp_path / "ca")
    loaded = Authority.load(tmp_path / "ca", with_key=False)
    assert loaded.key is None
    with pytest.raises(ConfigError, match="no key"):
        loaded.issue_pair(CertIdentity("client", "c"), (), NOW, 60.0)
    with pytest.raises(ConfigError, match="no usable fleet CA"):
        Authority.load(tmp_path / "nowhere")
