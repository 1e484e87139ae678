"""A local etcd cluster's members crash and come back: a killed member restarted on its
data directory rejoins, so the cluster survives one crash after another (a chaos run kills
a member every few minutes)."""

from __future__ import annotations

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
