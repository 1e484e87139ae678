"""A simulated fleet: the nodes and links of a fleet file on simulated time, the registry's
view of them (heartbeats, staleness, expiry of silent nodes), and a workload driven through
the devices as the demo drives it — answered, refused or lost, recorded as the demo records.

Staleness as live: a node's registry entry is what it said at its last heartbeat (every
``heartbeat_s``); a node rebuilds its view from the registry at most every
``view_refresh_s``, when a request needs it (not on a timer: 10,000 idle devices cost
nothing); a node silent for ``ttl_s`` drops out of everyone's view.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tierlink.core.types import LinkView, NodeView, Request
from tierlink.errors import TierlinkError
from tierlink.fleet.workload import Record, WorkItem
from tierlink.sim.http import HttpCosts
from tierlink.sim.node import SimNode


@dataclass
class _Entry:
    view: NodeView
    links: list[LinkView]
    at: float


@dataclass
class Registry:
    heartbeat_s: float = 1.0
    ttl_s: float = 5.0
    entries: dict[str, _Entry] = field(default_factory=dict)

    def beat(self, node: SimNode, now: float) -> None:
        if node.alive:
            self.entries[node.node_id] = _Entry(node.me(), node.link_views(), now)

    def fresh(self, nodes: Mapping[str, SimNode], ids: Sequence[str], now: float
              ) -> tuple[list[NodeView], list[LinkView]]:
        """The entries of ``ids`` as last heard (each node's heartbeat taken when due)."""
        views: list[NodeView] = []
        links: list[LinkView] = []
        for node_id in ids:
            entry = self.entries.get(node_id)
            if entry is None or now - entry.at >= self.heartbeat_s:
                self.beat(nodes[node_id], now)
                entry = self.entries.get(node_id)
            if entry is None or now - entry.at > self.ttl_s:
                continue
            views.append(entry.view)
            links.extend(entry.links)
        return views, links


class SimFleet:
    def __init__(self, nodes: Mapping[str, SimNode], registry: Registry,
                 clock: Callable[[], float], view_refresh_s: float = 0.25,
                 http: HttpCosts | None = None, rng: random.Random | None = None,
                 defer: bool = True) -> None:
        self.nodes = dict(nodes)
        self.defer = defer  # asynchronous requests wait for cheaper prices
        self.http = http or HttpCosts()  # the app's call into its node, drawn per request
        self.rng = rng or random.Random(0)
        self.registry = registry
        self.view_refresh_s = view_refresh_s
        self._clock = clock
        self._reach = {n: _reachable(self.nodes[n]) for n in self.nodes}
        for node in self.nodes.values():
            node.before_plan = self.view_of

    def view_of(self, node: SimNode) -> None:
        now = self._clock()
        if now - node.view_at < self.view_refresh_s:
            return
        # Its own entry is left out: a node sees itself live, never as it last beat.
        views, links = self.registry.fresh(self.nodes, self._reach[node.node_id][1:], now)
        node.refresh_view(views, links)

    async def request(self, item: WorkItem, task: str, label: int, input_bytes: int,
                      policy: str | None) -> Record:
        """One request from an application on ``item.origin``, as ``fleet/workload.drive``
        sends it: answered (with who, where, cost), refused (an error answer) or lost."""
        device = self.nodes[item.origin]
        start = self._clock()
        req = Request(f"r{item.seq}", task, item.deadline_ms, item.origin, item.privacy,
                      item.priority, input_bytes, policy=policy)
        half_s = self.http.request_s(self.rng) / 2  # 0 when the scenario prices none
        if half_s:
            await asyncio.sleep(half_s)
        try:
            if item.asynchronous and self.defer:
                req = await self._deferred(device, req)
            result = await device.handle(req, {"sample": np.asarray(item.sample)})
        except TierlinkError as exc:
            lost = not device.alive
            return Record(item, label, False, lost, exc.code,
                          (self._clock() - start + half_s) * 1000)
        # The answer's way back through the app's HTTP stack: counted, not waited for
        # (nothing else happens on the device because of it).
        out = result.outcome
        return Record(item, label, True, False, "", (self._clock() - start + half_s) * 1000.0,
                      pred=int(result.outputs["label"]),
                      tier=out.tier.label, served_by=out.served_by, cost=out.cost,
                      fallbacks=len(out.fallbacks), escalations=out.escalations,
                      degraded=out.degraded, model_version=out.model_version,
                      split=out.split, timings=dict(out.timings_ms), bill=out.bill)

    async def _deferred(self, device: SimNode, req: Request) -> Request:
        """An asynchronous request held until the time its device's deferral gives (as a
        live node's ``node/deferred.py``), with what is then left of its deadline."""
        wait_s = device.deferral(req)
        if wait_s <= 0:
            return req
        await asyncio.sleep(wait_s)
        return replace(req, deadline_ms=req.deadline_ms - wait_s * 1000.0)


def _reachable(start: SimNode) -> list[str]:
    """``start`` and every node it can reach through its upstreams, in order."""
    seen = [start.node_id]
    todo = list(start.upstreams.values())
    while todo:
        node = todo.pop(0)
        if node.node_id not in seen:
            seen.append(node.node_id)
            todo.extend(node.upstreams.values())
    return seen


async def drive(fleet: SimFleet, items: Sequence[WorkItem], task: str,
                labels: Sequence[int], input_bytes: int, policy: str | None,
                on_done: Callable[[Record], None] = lambda r: None) -> list[Record]:
    """Send every item at its simulated time; wait for every answer. Requests are started
    as their time comes (not all at once: an hour of a large fleet is millions of them)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    records: list[Record | None] = [None] * len(items)
    running: set[asyncio.Future[None]] = set()

    async def one(i: int, item: WorkItem) -> None:
        record = await fleet.request(item, task, int(labels[item.sample]), input_bytes, policy)
        records[i] = record
        on_done(record)

    for i in sorted(range(len(items)), key=lambda k: items[k].at_s):
        delay = start + items[i].at_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task_ = asyncio.ensure_future(one(i, items[i]))
        running.add(task_)
        task_.add_done_callback(running.discard)
    while running:
        await asyncio.gather(*list(running))
    return [r for r in records if r is not None]


def seeded(seed: int, *names: str) -> random.Random:
    """A generator of its own for each named part, all from one seed (a run is reproducible
    whatever order the parts draw in)."""
    return random.Random(f"{seed}:" + "/".join(names))
