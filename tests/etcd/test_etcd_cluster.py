"""A local etcd cluster's members crash and come back: a killed member restarted on its
data directory rejoins, so the cluster survives one crash after another (a chaos run kills
a member every few minutes)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tierlink.etcd.cluster import EtcdCluster


def put(member_url: str, value: str) -> int:
    return httpx.post(f"{member_url}/v3/kv/put", timeout=5.0,
                      json={"key": "Y2hhb3M=", "value": value}).status_code


def test_a_restarted_member_rejoins_and_the_next_crash_is_survived(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path, size=3).start() as cluster:
        cluster.kill(0)
        cluster.restart(0)
        assert cluster.members[0].running and put(cluster.members[0].client_url, "YQ==") == 200
        cluster.kill(1)  # two crashed in all, one at a time: a quorum was always there
        cluster.wait_ready(20.0, crashed_ok=True)
        assert put(cluster.members[2].client_url, "Yg==") == 200


def test_history_is_compacted_so_etcd_does_not_grow_without_end(tmp_path: Path) -> None:
    """Every overwrite of a key is a revision etcd keeps until compacted: the cluster is
    started with periodic compaction, so old revisions go (reading one is refused)."""
    with EtcdCluster(tmp_path, size=1, history="2s").start() as cluster:
        url = cluster.members[0].client_url
        for value in ("YQ==", "Yg==", "Yw==", "ZA=="):
            assert put(url, value) == 200
        first = httpx.post(f"{url}/v3/kv/range", json={"key": "Y2hhb3M="}, timeout=5.0)
        oldest = int(first.json()["kvs"][0]["create_revision"])
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            put(url, "ZQ==")
            old = httpx.post(f"{url}/v3/kv/range", timeout=5.0,
                             json={"key": "Y2hhb3M=", "revision": oldest})
            if "compacted" in old.text:
                return
            time.sleep(0.5)
        raise AssertionError(f"revision {oldest} still readable after 20 s: {old.text}")
