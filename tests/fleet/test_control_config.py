"""The fleet file's control section: SQLite or etcd replicas, refused when inconsistent."""

from __future__ import annotations

import pytest

from tierlink.errors import ConfigError
from tierlink.fleet.config import on_etcd, parse_fleet

NODES = {"nodes": [{"id": "edge-1", "tier": "edge", "models": ["m"]}], "links": []}


def test_the_default_is_one_sqlite_control_plane():
    cfg = parse_fleet(NODES)
    assert (cfg.control_store, cfg.control_replicas, cfg.etcd_members) == ("sqlite", 1, 3)
    assert on_etcd(cfg, None) is cfg
    assert on_etcd(cfg, 2).control_store == "etcd" and on_etcd(cfg, 2).control_replicas == 2


def test_replicas_over_etcd():
    cfg = parse_fleet({**NODES, "control": {"store": "etcd", "replicas": 3, "etcd_members": 5}})
    assert (cfg.control_store, cfg.control_replicas, cfg.etcd_members) == ("etcd", 3, 5)


@pytest.mark.parametrize("control, match", [
    ({"replicas": 2}, "share their state through etcd"),
    ({"store": "redis"}, "sqlite or etcd"),
    ({"store": "etcd", "etcd_members": 2}, "must be odd"),
    ({"store": "etcd", "replica": 2}, r"control.replica: unknown key \(did you mean control.replicas\?\)"),
])
def test_inconsistent_control_sections_are_refused(control, match):
    with pytest.raises(ConfigError, match=match):
        parse_fleet({**NODES, "control": control})


def test_topology_is_registry_or_static():
    assert parse_fleet(NODES).topology == "registry"
    with pytest.raises(ConfigError, match="registry or static"):
        parse_fleet({**NODES, "topology": "mesh"})
