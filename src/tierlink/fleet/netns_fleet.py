"""The parts of `tierlink up --netns` the launcher calls: each node in a namespace of its
own (tierlink.netns.fabric), the links' bandwidth and loss in the kernel
(tierlink.netns.shaping), and a reaper that cleans up if the launcher itself dies."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tierlink.fleet.state import FleetState
from tierlink.netns.fabric import Fabric, in_netns
from tierlink.netns.reaper import write_state
from tierlink.netns.shaping import link_commands, qdisc_commands

STATE_FILE = "netns.json"


def open_fabric(fleet: FleetState) -> None:
    """Make the fleet's namespaces and start its reaper; the fleet's processes in the
    root namespace listen on the bridge's address from now on."""
    fleet.fabric = Fabric.create([n.node_id for n in fleet.config.nodes])
    fleet.host = fleet.fabric.plan.gateway
    record(fleet)
    log = open(fleet.run_dir / "logs" / "reaper.log", "ab")  # noqa: SIM115 (the child's)
    fleet.reaper = subprocess.Popen(
        [sys.executable, "-m", "tierlink.netns.reaper", "--watch", str(os.getpid()),
         "--state", str(fleet.run_dir / STATE_FILE)], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()


def node_host(fleet: FleetState, node_id: str) -> str:
    return fleet.fabric.plan.host(node_id).address if fleet.fabric else fleet.host


def command(fleet: FleetState, name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` as the process ``name`` runs: a node inside its namespace."""
    if fleet.fabric is None or name not in {h.node_id for h in fleet.fabric.plan.hosts}:
        return list(argv)
    return in_netns(fleet.fabric.plan.host(name), argv)


def record(fleet: FleetState) -> None:
    """What the reaper removes if the launcher dies: every process, the fabric, cgroups."""
    if fleet.fabric is None:
        return
    pids = [p.pid for p in fleet.procs.values() if p.poll() is None]
    groups = [str(t.group) for t in fleet.throttles if getattr(t, "group", None)]
    write_state(fleet.run_dir / STATE_FILE, fleet.fabric.plan, pids, groups)


def shape_links(fleet: FleetState, link_ports: dict[str, int]) -> None:
    """Each link's bandwidth and loss in the kernel (the emulator keeps delay, jitter)."""
    if fleet.fabric is None:
        return
    plan, links = fleet.fabric.plan, fleet.config.links
    shaped = {l.src for l in links if l.bandwidth_mbit or l.loss}
    commands = qdisc_commands(plan, shaped)
    for i, link in enumerate(links):
        commands += link_commands(plan.host(link.src), plan.gateway, link_ports[link.name],
                                  0x10 + i, link.bandwidth_mbit, link.loss)
    fleet.fabric.apply(commands)


def close_fabric(fleet: FleetState) -> list[str]:
    """Remove the namespaces (after the processes in them stopped) and end the reaper."""
    if fleet.fabric is None:
        return []
    left = fleet.fabric.destroy()
    Path(fleet.run_dir / STATE_FILE).unlink(missing_ok=True)  # the reaper exits on its own
    if fleet.reaper is not None:
        try:
            fleet.reaper.wait(5)
        except subprocess.TimeoutExpired:
            fleet.reaper.kill()
            fleet.reaper.wait(5)
    fleet.fabric = None
    return left
