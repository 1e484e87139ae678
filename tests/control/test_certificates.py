"""POST /v1/certificate: an enrolled node gets a certificate naming itself and the tier it
enrolled as, whatever its CSR says; operators, strangers and revoked nodes get none."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tierlink.control.app import create_app
from tierlink.control.identity import IdentityStore, bearer
from tierlink.control.store import SqliteRegistryStore
from tierlink.security.pki import Authority, CertIdentity, csr_pem, identity_of, new_key

ADMIN = "admin-token-0123456789"


def test_an_enrolled_node_gets_a_certificate_naming_itself(tmp_path: Path) -> None:
    db = tmp_path / "control.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, ADMIN)
    secret = identity.enroll(identity.create_token(0.0), "edge-1", "edge", 1.0)
    node = {"authorization": bearer("node", secret, "edge-1")}
    ca = Authority.create("t", 1_800_000_000.0)
    app = create_app(registry, identity=identity, authority=ca, cert_ttl_s=120.0,
                     clock=lambda: 1_800_000_000.0)
    csr = csr_pem(new_key(), ("127.0.0.1",)).decode()
    try:
        with TestClient(app) as http:
            answer = http.post("/v1/certificate", headers=node, json={"csr": csr})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert identity_of(body["certificate"].encode()) == \
                CertIdentity("node", "edge-1", "edge")
            assert body["ca"].encode() == ca.cert_pem
            assert body["not_after"] == 1_800_000_000.0 + 120.0
            admin = {"authorization": bearer("admin", ADMIN)}
            assert http.post("/v1/certificate", headers=admin,
                             json={"csr": csr}).status_code == 401
            assert http.post("/v1/certificate", json={"csr": csr}).status_code == 401
            bad = http.post("/v1/certificate", headers=node, json={"csr": "x" * 80})
            assert bad.status_code == 400 and "PEM" in bad.json()["error"], bad.text
            assert http.post("/v1/credentials/edge-1/revoke", headers=admin).status_code == 200
            assert http.post("/v1/certificate", headers=node,
                             json={"csr": csr}).status_code == 401
    finally:
        identity.close()
        registry.close()
