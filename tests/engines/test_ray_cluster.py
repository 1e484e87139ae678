"""The Ray cluster's commands: ports that cannot collide with a fleet's or a second
cluster's."""

from __future__ import annotations

from tierlink.engines import ray_cluster


def test_cluster_commands_keep_clear_of_fixed_ports() -> None:
    head = ray_cluster.head_command("127.0.0.1", 20000, 1.5)
    assert head[head.index("--num-cpus") + 1] == "1.5" and "--block" in head
    assert head[head.index("--min-worker-port") + 1] == "0"
    assert "--include-dashboard=false" in head and "--ray-client-server-port" in head
    worker = ray_cluster.worker_command("10.0.0.1:20000", "10.99.99.99", 1)
    assert worker[worker.index("--address") + 1] == "10.0.0.1:20000"
    assert "--dashboard-agent-listen-port" in worker  # any port: a namespace of its own
