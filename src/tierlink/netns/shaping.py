"""A fleet's links shaped by the kernel. Pure: the ``tc`` and ``iptables`` commands.

Every link of the fleet file still goes through the link emulator in the root namespace
(this kernel has no ``netem``, so one-way delay and jitter stay there), but its bandwidth
and loss are the kernel's:

* **bandwidth** — an ``htb`` class per link, rate = ceil = the link's bandwidth, on both
  ends of the source node's veth pair: ``eth0`` inside its namespace classifies what it
  sends to the link's port (``ip dport``), the root-side end what comes back from it
  (``ip sport``). Traffic of no link (heartbeats, the control plane) is not shaped.
* **loss** — ``iptables -m statistic --mode random`` drops in the source's namespace, both
  directions of the link's port: real packet loss, so TCP retransmits as it would.

The emulator is then told the link has no bandwidth limit and no loss of its own.
"""

from __future__ import annotations

from tierlink.netns.fabric import FabricPlan, Host


def _mbit(value: float) -> str:
    return f"{max(1, round(value * 1000))}kbit"


def qdisc_commands(plan: FabricPlan, shaped: set[str]) -> list[list[str]]:
    """An htb root on both ends of each shaped host's veth (unclassified traffic passes)."""
    cmds = []
    for h in plan.hosts:
        if h.node_id in shaped:
            cmds += [["ip", "netns", "exec", h.netns, "tc", "qdisc", "add", "dev", "eth0",
                      "root", "handle", "1:", "htb"],
                     ["tc", "qdisc", "add", "dev", h.veth, "root", "handle", "1:", "htb"]]
    return cmds


def link_commands(src: Host, gateway: str, port: int, class_id: int,
                  bandwidth_mbit: float | None, loss: float) -> list[list[str]]:
    """The commands shaping one link: ``src``'s traffic to ``gateway:port`` and back."""
    cmds: list[list[str]] = []
    ns = ["ip", "netns", "exec", src.netns]
    if bandwidth_mbit:
        rate = _mbit(bandwidth_mbit)
        flow = f"1:{class_id:x}"
        for prefix, dev, match in ((ns, "eth0", "dport"), ([], src.veth, "sport")):
            cmds += [[*prefix, "tc", "class", "add", "dev", dev, "parent", "1:", "classid",
                      flow, "htb", "rate", rate, "ceil", rate],
                     [*prefix, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol",
                      "ip", "prio", "1", "u32", "match", "ip", match, str(port), "0xffff",
                      "flowid", flow]]
    if loss > 0:
        p = f"{loss:.6f}"
        cmds += [[*ns, "iptables", "-A", "OUTPUT", "-p", "tcp", "-d", gateway, "--dport",
                  str(port), "-m", "statistic", "--mode", "random", "--probability", p,
                  "-j", "DROP"],
                 [*ns, "iptables", "-A", "INPUT", "-p", "tcp", "-s", gateway, "--sport",
                  str(port), "-m", "statistic", "--mode", "random", "--probability", p,
                  "-j", "DROP"]]
    return cmds
