"""Routing revisions on etcd: replicas hand out one number once, and read the same history."""

from __future__ import annotations

import pytest

from tierlink.control.routing_revisions import EtcdRoutingRevisions, RoutingControl
from tierlink.etcd.client import Etcd

pytestmark = pytest.mark.integration


@pytest.fixture
def etcd(etcd_cluster):
    with Etcd(etcd_cluster.endpoints) as client:
        yield client


def test_replicas_number_revisions_once_and_share_them(etcd, etcd_prefix):
    a = RoutingControl(EtcdRoutingRevisions(etcd, prefix=etcd_prefix), cache_s=0.0)
    b = RoutingControl(EtcdRoutingRevisions(etcd, prefix=etcd_prefix), cache_s=0.0)
    assert a.apply({"policy": "tierlink"}, "tierlink up", start=True).revision == 1
    assert b.apply({"policy": "bandit"}, "apply").revision == 2
    assert a.apply({"weights": {"cost": 1.0}}, "apply").revision == 3
    assert [r.revision for r in b.store.history()] == [3, 2, 1]
    assert b.for_node(2) == {"revision": 3, "config": dict(a.store.latest().routing)}
    previous = b.store.history()[1]
    back = a.revert()
    assert (back.revision, back.routing) == (4, previous.routing)
