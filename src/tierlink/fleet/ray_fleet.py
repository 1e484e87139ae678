"""The Ray cluster of a fleet whose nodes say ``engine: ray``: `tierlink up` starts one head
(engines/ray_cluster.py) before the nodes, sized for every Ray node's replicas at their
maximum, gives those nodes its address, and stops it — its own process group, never
`ray stop` — after the nodes have deleted their deployments."""

from __future__ import annotations

from tierlink.fleet.state import FleetState
from tierlink.netports import pick_port

HEAD = "ray-head"


def needs_ray(fleet: FleetState) -> bool:
    return any(n.engine.on_ray for n in fleet.config.nodes)


def start_ray(fleet: FleetState, timeout_s: float) -> None:
    """A head on the fleet's host with CPUs for every Ray node's replicas at their maximum:
    each model a node serves is a deployment of its own, and a version being installed runs
    beside the active one until it takes over."""
    from tierlink.engines import ray_cluster

    if not needs_ray(fleet):
        return
    if fleet.fabric is not None:
        raise ray_cluster.RayClusterError(
            "engine: ray nodes on namespaces are not supported yet",
            hint="run the fleet without --netns")
    cpus = sum((len(n.models) + 1) * n.engine.max_replicas * n.engine.num_cpus
               for n in fleet.config.nodes if n.engine.on_ray)
    port = pick_port(fleet.host)
    proc = ray_cluster.start(ray_cluster.head_command(fleet.host, port, max(1.0, cpus)),
                             fleet.run_dir / "logs" / f"{HEAD}.log")
    fleet.procs[HEAD] = proc
    ray_cluster.wait_listening(fleet.host, port, proc, timeout_s)
    fleet.ray_address = f"{fleet.host}:{port}"


def stop_ray(fleet: FleetState) -> None:
    proc = fleet.procs.get(HEAD)
    if proc is not None:
        from tierlink.engines import ray_cluster

        ray_cluster.stop(proc)
