"""The namespaces, veth pairs and bridge of a fleet on kernel networking.

One bridge ``tlb<tag>`` in the root namespace holds the gateway address
(``10.<a>.<b>.1/24``: the control plane, the link emulator and the launcher live there);
each node gets a namespace ``tl-<tag>-<i>`` whose ``eth0`` (one end of a veth pair, the
other, ``tlv<tag><i>``, enslaved to the bridge) has ``10.<a>.<b>.<10+i>`` and a default
route through the gateway. Names carry a random run tag, so fleets side by side (tests,
benchmarks) never share an interface, and everything of a run is found again by its tag.

:func:`plan_fabric` is pure; :class:`Fabric` runs the ``ip`` commands (through an injected
runner) and undoes them — every command of :func:`down_commands` is tried even when an
earlier one fails, so a half-made fabric is removed as well as a whole one.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tierlink.errors import ConfigError, TierlinkError

Runner = Callable[[Sequence[str]], None]
FIRST_HOST = 10  # node i gets .10 + i
MAX_NODES = 240


class NetnsError(TierlinkError):
    code = "netns_error"
    hint = ("namespaces need root and iproute2 (`ip`, `tc`) and iptables; without them run "
            "the fleet without --netns (the user-space link emulator)")


@dataclass(frozen=True, slots=True)
class Host:
    node_id: str
    netns: str  # the namespace
    veth: str  # the root-side end of its veth pair (on the bridge)
    address: str  # its eth0 address inside the namespace


@dataclass(frozen=True, slots=True)
class FabricPlan:
    tag: str
    bridge: str
    gateway: str  # the bridge's address: the root namespace as the nodes see it
    prefix_len: int
    hosts: tuple[Host, ...]

    def host(self, node_id: str) -> Host:
        for h in self.hosts:
            if h.node_id == node_id:
                return h
        raise ConfigError(f"node {node_id!r} has no namespace in fabric {self.tag}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FabricPlan:
        hosts = tuple(Host(**h) for h in data["hosts"])
        return cls(data["tag"], data["bridge"], data["gateway"], int(data["prefix_len"]), hosts)


def new_tag() -> str:
    return secrets.token_hex(3)  # 6 hex digits: interface names stay under 15 characters


def plan_fabric(tag: str, node_ids: Sequence[str], subnet: ipaddress.IPv4Network) -> FabricPlan:
    """Names and addresses for ``node_ids`` on ``subnet`` (a /24 or larger)."""
    if len(node_ids) > MAX_NODES or subnet.num_addresses < FIRST_HOST + len(node_ids) + 1:
        raise ConfigError(f"{len(node_ids)} nodes do not fit in {subnet}")
    base = subnet.network_address
    hosts = tuple(Host(node_id, f"tl-{tag}-{i}", f"tlv{tag}{i}", str(base + FIRST_HOST + i))
                  for i, node_id in enumerate(node_ids))
    return FabricPlan(tag, f"tlb{tag}", str(base + 1), subnet.prefixlen, hosts)


def pick_subnet(tag: str, in_use: Callable[[], str]) -> ipaddress.IPv4Network:
    """A /24 under 10.200.0.0/13 no interface of this machine is on (``in_use``: the
    output of ``ip -o -4 addr``), chosen from the tag so retries spread."""
    taken = in_use()
    seed = int(tag, 16)
    for step in range(2048):
        k = (seed + step * 7919) % 2048
        prefix = f"10.{200 + k // 256}.{k % 256}"
        if f"inet {prefix}." not in taken:
            return ipaddress.IPv4Network(f"{prefix}.0/24")
    raise NetnsError("no free /24 under 10.200.0.0/13 for the fleet's namespaces")


def up_commands(plan: FabricPlan) -> list[list[str]]:
    cmds = [["ip", "link", "add", plan.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{plan.gateway}/{plan.prefix_len}", "dev", plan.bridge],
            ["ip", "link", "set", plan.bridge, "up"]]
    for h in plan.hosts:
        cmds += [["ip", "netns", "add", h.netns],
                 ["ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0",
                  "netns", h.netns],
                 ["ip", "link", "set", h.veth, "master", plan.bridge, "up"],
                 ["ip", "-n", h.netns, "addr", "add", f"{h.address}/{plan.prefix_len}",
                  "dev", "eth0"],
                 ["ip", "-n", h.netns, "link", "set", "eth0", "up"],
                 ["ip", "-n", h.netns, "link", "set", "lo", "up"],
                 ["ip", "-n", h.netns, "route", "add", "default", "via", plan.gateway]]
    return cmds


def down_commands(plan: FabricPlan) -> list[list[str]]:
    """Deleting a namespace deletes its eth0 and so the veth pair; the bridge goes last."""
    return [*(["ip", "netns", "del", h.netns] for h in plan.hosts),
            *(["ip", "link", "del", h.veth] for h in plan.hosts),
            ["ip", "link", "del", plan.bridge]]


def in_netns(host: Host, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``host``'s namespace (``ip netns exec`` execs: the pid is argv's)."""
    return ["ip", "netns", "exec", host.netns, *argv]


def run_command(argv: Sequence[str]) -> None:
    try:
        subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise NetnsError(f"{argv[0]} is not installed") from exc
    except subprocess.CalledProcessError as exc:
        raise NetnsError(f"`{' '.join(argv)}` failed: {exc.stderr.strip() or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"`{' '.join(argv)}` did not finish in 30 s") from exc


def addresses_in_use() -> str:
    return subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True,
                          check=False).stdout


class Fabric:
    """A made fabric; :meth:`destroy` undoes it (idempotent)."""

    def __init__(self, plan: FabricPlan, run: Runner = run_command) -> None:
        self.plan, self._run = plan, run

    @classmethod
    def create(cls, node_ids: Sequence[str], run: Runner = run_command,
               in_use: Callable[[], str] = addresses_in_use) -> Fabric:
        tag = new_tag()
        fabric = cls(plan_fabric(tag, node_ids, pick_subnet(tag, in_use)), run)
        try:
            for argv in up_commands(fabric.plan):
                run(argv)
        except BaseException:
            fabric.destroy()
            raise
        return fabric

    def destroy(self) -> list[str]:
        """Remove everything of the plan; the commands that failed (already gone)."""
        return destroy_plan(self.plan, self._run)

    def apply(self, commands: Sequence[Sequence[str]]) -> None:
        for argv in commands:
            self._run(argv)


def destroy_plan(plan: FabricPlan, run: Runner = run_command) -> list[str]:
    """Every command of :func:`down_commands`; those that failed on something still
    there (a veth pair goes with its namespace: deleting it again fails, as it should)."""
    failed = []
    for argv in down_commands(plan):
        try:
            run(argv)
        except NetnsError:
            if _exists(argv[-1], namespace=argv[1] == "netns"):
                failed.append(" ".join(argv))
    return failed


def _exists(name: str, *, namespace: bool) -> bool:
    if namespace:
        return Path(f"/run/netns/{name}").exists()
    return Path(f"/sys/class/net/{name}").exists()
