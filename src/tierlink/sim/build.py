"""A fleet file as a simulated fleet: its nodes with their models' cards, their workers and
speed (a ``cpu_quota`` of 0.5 runs models at half the card's speed), its links (delay,
jitter, bandwidth, loss), its routing — plus what a scenario adds (outages, slow nodes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tierlink.core.types import ModelView, Tier
from tierlink.errors import ConfigError
from tierlink.fleet.config import FleetConfig
from tierlink.policy.base import Weights
from tierlink.sim.compute import ComputeModel
from tierlink.sim.fleet import Registry, SimFleet, seeded
from tierlink.sim.http import HttpCosts
from tierlink.sim.links import LinkShape, SimLink
from tierlink.sim.node import Counters, SimNode
from tierlink.sim.outcomes import Outcomes
from tierlink.sim.power import DevicePower


@dataclass(frozen=True, slots=True)
class Scenario:
    """What happens to the fleet during a run, beyond its file."""

    # link name ("src->dst") -> (start_s, end_s) windows where it carries nothing
    outages: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # link name -> (start_s, end_s, factor) windows where its delay is ``factor`` times longer
    link_slow: Mapping[str, tuple[tuple[float, float, float], ...]] = field(
        default_factory=dict)
    # node -> (start_s, end_s) windows where its process is down (then restarted)
    crashes: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # node -> (start_s, end_s, factor) windows where it computes ``factor`` times slower
    slow: Mapping[str, tuple[tuple[float, float, float], ...]] = field(default_factory=dict)
    speed: Mapping[str, float] = field(default_factory=dict)  # node -> factor on its speed
    jitter: float = 0.15  # σ of the log of a model's run time
    # What the HTTP stacks cost beyond the wire and the model (sim/http.py: measured on
    # this machine by benchmarks/routing_overhead.py, or from a live run's request log).
    http: HttpCosts = field(default_factory=HttpCosts)
    compute_overhead_ms: float = 0.0  # a node's own work around each model run (ms)
    power: DevicePower | None = None  # devices' batteries and heat (sim/power.py)
    # Shadow mode on the devices: a candidate policy (a name; with other weights, if any)
    # decides beside the acting one, which explores this share of the time.
    shadow: str | None = None
    shadow_weights: Weights | None = None
    explore: float = 0.0
    heartbeat_s: float = 1.0
    view_refresh_s: float = 0.25
    # Asynchronous requests wait for a cheaper price window when their deadline reaches one
    # (routing/deferral.py), as a live node's do; False: they run at once.
    defer: bool = True
    ttl_s: float = 5.0


def build(config: FleetConfig, views: Mapping[str, ModelView],
          outcomes: Mapping[str, Outcomes], clock: Callable[[], float], seed: int,
          scenario: Scenario | None = None) -> tuple[SimFleet, Counters]:
    """The fleet's nodes and links; models whose task has no outcomes are left out."""
    sc = scenario or Scenario()
    counters = Counters()
    nodes: dict[str, SimNode] = {}
    for n in config.nodes:
        models = {name: views[name]  # their cards: latency as measured, before the speed
                  for name in n.models if name in views and views[name].task in outcomes}
        speed = (n.cpu_quota or 1.0) * sc.speed.get(n.node_id, 1.0)
        nodes[n.node_id] = SimNode(
            n.node_id, n.tier, models, config.routing, outcomes, counters,
            seeded(seed, "node", n.node_id), workers=n.workers, max_queue=n.max_queue,
            escalation_queue=n.escalation_queue,
            compute=ComputeModel(speed=speed, jitter=sc.jitter,
                                 overhead_ms=sc.compute_overhead_ms), http=sc.http,
            clock=clock, heads={name: views[name] for name in n.heads
                                if name in views and views[name].task in outcomes})
    for link in config.links:
        shape = LinkShape(link.rtt_ms, link.bandwidth_mbit, link.jitter_ms, link.loss,
                          sc.outages.get(link.name, ()), sc.link_slow.get(link.name, ()))
        nodes[link.src].connect(nodes[link.dst], SimLink(link.src, link.dst, shape,
                                                         seeded(seed, "link", link.name)))
    registry = Registry(heartbeat_s=sc.heartbeat_s, ttl_s=sc.ttl_s)
    _schedule_faults(nodes, sc)
    if sc.power is not None:
        _power_devices(nodes, sc.power)
    if sc.shadow is not None:
        _shadow_devices(nodes, config, sc, seed)
    return SimFleet(nodes, registry, clock, sc.view_refresh_s, sc.http,
                    seeded(seed, "http"), defer=sc.defer), counters


def _schedule_faults(nodes: Mapping[str, SimNode], sc: Scenario) -> None:
    """Crashes and slowdowns at their simulated times (call from the simulation's loop)."""
    import asyncio

    loop = asyncio.get_running_loop()
    for node_id in [*sc.crashes, *sc.slow]:
        if node_id not in nodes:
            raise ConfigError(f"the scenario names node {node_id!r}, which the fleet lacks")
    for node_id, crashes in sc.crashes.items():
        for start, end in crashes:
            loop.call_at(start, nodes[node_id].crash)
            loop.call_at(end, nodes[node_id].restart)
    for node_id, slow in sc.slow.items():
        compute = nodes[node_id].compute
        for start, end, factor in slow:
            loop.call_at(start, _scale, compute, 1.0 / factor)
            loop.call_at(end, _scale, compute, factor)


def _power_devices(nodes: Mapping[str, SimNode], power: DevicePower) -> None:
    unknown = sorted(set(power.devices or ()) - set(nodes))
    if unknown:
        raise ConfigError(f"the scenario's power block names {unknown}, which the fleet lacks")
    for node in nodes.values():
        if node.tier is Tier.DEVICE and power.applies_to(node.node_id):
            node.with_power(power)


def _scale(compute: ComputeModel, factor: float) -> None:
    compute.speed *= factor


def _shadow_devices(nodes: Mapping[str, SimNode], config: FleetConfig, sc: Scenario,
                    seed: int) -> None:
    from dataclasses import replace as with_

    from tierlink.routing.router import shadow_run

    cfg = config.routing.policy_config()
    if sc.shadow_weights is not None:
        cfg = with_(cfg, weights=sc.shadow_weights)
    for node in nodes.values():
        if node.tier is Tier.DEVICE:
            node.router.shadow = shadow_run(str(sc.shadow), cfg, None, sc.explore,
                                            seeded(seed, "shadow", node.node_id),
                                            node.counters.shadow_log.append,
                                            config.routing.reward)
