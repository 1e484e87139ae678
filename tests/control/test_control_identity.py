"""Node identity on the control plane: tokens, enrollment, who may call what, revocation."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tierlink.control.app import create_app
from tierlink.control.identity import (
    ADMIN_ONLY,
    ANY,
    OPEN,
    SELF,
    AlreadyEnrolled,
    IdentityStore,
    access_rule,
    bearer,
    load_or_create_admin_token,
    parse_bearer,
)
from tierlink.control.store import SqliteRegistryStore
from tierlink.errors import ConfigError, NotEnrolled

ADMIN = "admin-token-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "etcd"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    """Each store test runs on SQLite and on a real etcd cluster (a prefix of its own)."""
    if request.param == "sqlite":
        s = IdentityStore(tmp_path / "r.db", ADMIN)
        yield s
        s.close()
        return
    from tierlink.control.etcd_identity import EtcdIdentityStore
    from tierlink.etcd.client import Etcd

    cluster = request.getfixturevalue("etcd_cluster")
    with Etcd(cluster.endpoints) as etcd:
        s = EtcdIdentityStore(etcd, ADMIN, prefix=request.getfixturevalue("etcd_prefix")).start()
        yield s
        s.close()


def test_a_token_enrolls_a_node_that_then_authenticates(store):
    token = store.create_token(0.0)
    secret = store.enroll(token, "edge-1", "edge", 1.0)
    caller = store.authenticate(bearer("node", secret, "edge-1"))
    assert (caller.kind, caller.node_id) == ("node", "edge-1")
    with pytest.raises(NotEnrolled, match="not enrolled"):
        store.authenticate(bearer("node", secret + "x", "edge-1"))
    with pytest.raises(NotEnrolled, match="not enrolled"):
        store.authenticate(bearer("node", secret, "edge-2"))


def test_tokens_expire_run_out_and_cannot_be_guessed(store):
    with pytest.raises(NotEnrolled, match="unknown"):
        store.enroll("x" * 43, "edge-1", "edge", 0.0)
    short = store.create_token(0.0, ttl_s=10.0)
    with pytest.raises(NotEnrolled, match="expired"):
        store.enroll(short, "edge-1", "edge", 11.0)
    once = store.create_token(0.0, uses=1)
    store.enroll(once, "edge-1", "edge", 1.0)
    with pytest.raises(NotEnrolled, match="used up"):
        store.enroll(once, "edge-2", "edge", 2.0)


def test_an_id_enrolls_once_and_a_revoked_id_never_again(store):
    token = store.create_token(0.0)
    secret = store.enroll(token, "dev-1", "device", 1.0)
    with pytest.raises(AlreadyEnrolled):
        store.enroll(token, "dev-1", "device", 2.0)
    assert store.revoke("dev-1", 3.0)
    assert not store.revoke("dev-1", 4.0)
    with pytest.raises(NotEnrolled, match="revoked"):
        store.authenticate(bearer("node", secret, "dev-1"))
    with pytest.raises(NotEnrolled, match="revoked"):
        store.enroll(token, "dev-1", "device", 5.0)
    assert [c.revoked for c in store.credentials()] == [True]


def test_admin_token_and_malformed_headers(store):
    assert store.authenticate(bearer("admin", ADMIN)).kind == "admin"
    for header in (None, "", "Basic abc", "Bearer admin:wrong-token-xxxxxxxx", "Bearer node:x",
                   "Bearer whatever"):
        with pytest.raises(NotEnrolled):
            store.authenticate(header)
    assert parse_bearer("Bearer node:a.b:c") == ("node", "a.b", "c")


def test_access_rules():
    assert access_rule("GET", "/healthz") == (OPEN, None)
    assert access_rule("POST", "/v1/enroll") == (OPEN, None)
    assert access_rule("GET", "/v1/nodes") == (ANY, None)
    assert access_rule("POST", "/v1/nodes/edge-1/heartbeat") == (SELF, "edge-1")
    assert access_rule("DELETE", "/v1/nodes/edge-1") == (SELF, "edge-1")
    assert access_rule("GET", "/v1/models/fmnist-small/versions") == (ANY, None)
    assert access_rule("POST", "/v1/models/fmnist-small/versions") == (ADMIN_ONLY, None)
    assert access_rule("PUT", "/v1/blobs/ab") == (ADMIN_ONLY, None)
    assert access_rule("GET", "/v1/hard-examples/export") == (ADMIN_ONLY, None)
    assert access_rule("POST", "/v1/hard-examples") == (ANY, None)
    assert access_rule("POST", "/v1/rollouts") == (ADMIN_ONLY, None)


def test_admin_token_file_is_created_private_and_reused(tmp_path):
    path = tmp_path / "sub" / "admin.token"
    token = load_or_create_admin_token(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_or_create_admin_token(path) == token
    path.write_text("short")
    with pytest.raises(ConfigError, match="fewer than 16"):
        load_or_create_admin_token(path)


def _heartbeat(node_id: str = "edge-1") -> dict:
    return {"node_id": node_id, "tier": "edge", "address": "http://127.0.0.1:1",
            "started_at": 1.0}


def test_the_app_refuses_unknown_and_revoked_nodes(tmp_path):
    db = tmp_path / "r.db"
    registry, identity, clock = SqliteRegistryStore(db), IdentityStore(db, ADMIN), Clock()
    admin = {"authorization": bearer("admin", ADMIN)}
    try:
        with TestClient(create_app(registry, clock=clock, identity=identity)) as c:
            assert c.get("/healthz").status_code == 200
            anonymous = c.post("/v1/nodes/edge-1/heartbeat", json=_heartbeat())
            assert anonymous.status_code == 401 and anonymous.json()["code"] == "not_enrolled"

            token = c.post("/v1/enrollment-tokens", json={"uses": 2}, headers=admin).json()
            assert c.post("/v1/enroll", json={"token": "y" * 40, "node_id": "edge-1",
                                              "tier": "edge"}).status_code == 401
            secret = c.post("/v1/enroll", json={"token": token["token"], "node_id": "edge-1",
                                                "tier": "edge"}).json()["secret"]
            node = {"authorization": bearer("node", secret, "edge-1")}
            assert c.post("/v1/nodes/edge-1/heartbeat", json=_heartbeat(),
                          headers=node).status_code == 200
            assert c.get("/v1/nodes", headers=node).json()["nodes"][0]["node_id"] == "edge-1"
            # A node acts only as itself and is no operator.
            other = c.post("/v1/nodes/edge-2/heartbeat", json=_heartbeat("edge-2"), headers=node)
            assert other.status_code == 403
            assert c.post("/v1/enrollment-tokens", json={}, headers=node).status_code == 403

            revoked = c.post("/v1/credentials/edge-1/revoke", headers=admin)
            assert revoked.status_code == 200
            assert c.get("/v1/nodes", headers=admin).json()["nodes"] == []  # left the registry
            again = c.post("/v1/nodes/edge-1/heartbeat", json=_heartbeat(), headers=node)
            assert again.status_code == 401 and "revoked" in again.json()["error"]
            assert c.post("/v1/credentials/edge-1/revoke", headers=admin).status_code == 404
            listed = c.get("/v1/credentials", headers=admin).json()["nodes"]
            assert [(n["node_id"], n["revoked_at"] is not None) for n in listed] == [
                ("edge-1", True)]
    finally:
        identity.close()
        registry.close()


def test_draining_a_node_is_for_operators():
    assert access_rule("POST", "/v1/nodes/edge-1/drain") == (ADMIN_ONLY, None)
    assert access_rule("DELETE", "/v1/nodes/edge-1/drain") == (ADMIN_ONLY, None)
