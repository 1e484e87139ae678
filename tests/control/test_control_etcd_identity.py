"""Credentials on etcd, shared by replicas: a node enrolled at one replica is known at the
other at once, a revocation reaches both, and a token's last use is spent once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tierlink.control.etcd_identity import EtcdIdentityStore
from tierlink.control.identity import bearer
from tierlink.errors import NotEnrolled
from tierlink.etcd.client import Etcd

pytestmark = pytest.mark.integration

ADMIN = "admin-token-0123456789"


@pytest.fixture
def pair(etcd_cluster, etcd_prefix):
    clients = [Etcd(etcd_cluster.endpoints) for _ in range(2)]
    stores = [EtcdIdentityStore(c, ADMIN, prefix=etcd_prefix).start() for c in clients]
    yield stores
    for s, c in zip(stores, clients, strict=True):
        s.close()
        c.close()


def test_a_node_enrolled_at_one_replica_authenticates_at_the_other(pair):
    a, b = pair
    secret = a.enroll(a.create_token(0.0), "edge-1", "edge", 1.0)
    assert b.authenticate(bearer("node", secret, "edge-1")).node_id == "edge-1"


def test_a_revocation_at_one_replica_reaches_the_other(pair):
    a, b = pair
    secret = a.enroll(a.create_token(0.0), "edge-1", "edge", 1.0)
    header = bearer("node", secret, "edge-1")
    a.authenticate(header)
    assert b.revoke("edge-1", 2.0)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            a.authenticate(header)
        except NotEnrolled as exc:
            assert "revoked" in str(exc)
            break
        time.sleep(0.02)
    else:
        pytest.fail("replica a still accepts a node revoked at replica b")


def test_the_last_use_of_a_token_is_spent_once_across_replicas(pair):
    a, b = pair
    token = a.create_token(0.0, uses=1)

    def enroll(args):
        store, node_id = args
        try:
            return store.enroll(token, node_id, "device", 1.0)
        except NotEnrolled:
            return None

    with ThreadPoolExecutor(2) as pool:
        secrets = list(pool.map(enroll, [(a, "dev-1"), (b, "dev-2")]))
    assert sum(s is not None for s in secrets) == 1
