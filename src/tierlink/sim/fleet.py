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
import functools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tierlink.core.types import LinkView, NodeView, Request
from tierlink.errors import TierlinkError
from tierlink.fleet.workload import Record, WorkItem
from tierlink.node.steps import StepResult
from tierlink.sim.dispatch import Chain
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
        self.clock = clock
        self._reach = {n: _reachable(self.nodes[n]) for n in self.nodes}
        for node in self.nodes.values():
            node.before_plan = self.view_of

    def view_of(self, node: SimNode) -> None:
        now = self.clock()
        if now - node.view_at < self.view_refresh_s:
            return
        # Its own entry is left out: a node sees itself live, never as it last beat.
        views, links = self.registry.fresh(self.nodes, self._reach[node.node_id][1:], now)
        node.refresh_view(views, links)

    def request(self, item: WorkItem, task: str, label: int, input_bytes: int,
                policy: str | None, done: Callable[[Record], None]) -> None:
        """One request from an application on ``item.origin``, as ``fleet/workload.drive``
        sends it; ``done`` gets its record: answered (with who, where, cost), refused (an
        error answer) or lost."""
        req = Request(f"r{item.seq}", task, item.deadline_ms, item.origin, item.privacy,
                      item.priority, input_bytes, policy=policy)
        half_s = self.http.request_s(self.rng) / 2  # 0 when the scenario prices none
        call = _AppCall(self, item, label, self.clock(), half_s, done)
        if half_s:
            asyncio.get_running_loop().call_later(half_s, call.arrive, req)
        else:
            call.arrive(req)


class _AppCall:
    """One application request on its way through its device, to its record."""

    __slots__ = ("_done", "_fleet", "_half_s", "_item", "_label", "_start")

    def __init__(self, fleet: SimFleet, item: WorkItem, label: int, start: float,
                 half_s: float, done: Callable[[Record], None]) -> None:
        self._fleet, self._item, self._label = fleet, item, label
        self._start, self._half_s, self._done = start, half_s, done

    def arrive(self, req: Request) -> None:
        """An asynchronous request is held until the time its device's deferral gives (as
        a live node's ``node/deferred.py``), with what is then left of its deadline."""
        if self._item.asynchronous and self._fleet.defer:
            try:
                wait_s = self._fleet.nodes[self._item.origin].deferral(req)
            except TierlinkError as exc:
                self.answered(None, exc)
                return
            if wait_s > 0:
                asyncio.get_running_loop().call_later(
                    wait_s, self.send, replace(req, deadline_ms=req.deadline_ms - wait_s * 1000.0))
                return
        self.send(req)

    def send(self, req: Request) -> None:
        device = self._fleet.nodes[self._item.origin]
        try:
            device.handle(req, {"sample": np.asarray(self._item.sample)}, self.answered, Chain())
        except TierlinkError as exc:
            self.answered(None, exc)

    def answered(self, result: StepResult | None, error: TierlinkError | None) -> None:
        item, clock = self._item, self._fleet.clock
        latency_ms = (clock() - self._start + self._half_s) * 1000.0
        if error is not None or result is None:
            lost = not self._fleet.nodes[item.origin].alive
            self._done(Record(item, self._label, False, lost,
                              error.code if error is not None else "", latency_ms))
            return
        # The answer's way back through the app's HTTP stack: counted, not waited for
        # (nothing else happens on the device because of it).
        out = result.outcome
        self._done(Record(item, self._label, True, False, "", latency_ms,
                          pred=int(result.outputs["label"]),
                          tier=out.tier.label, served_by=out.served_by, cost=out.cost,
                          fallbacks=len(out.fallbacks), escalations=out.escalations,
                          degraded=out.degraded, model_version=out.model_version,
                          split=out.split, timings=dict(out.timings_ms), bill=out.bill))


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
                on_done: Callable[[Record], None] = lambda r: None,
                keep: bool = True) -> list[Record]:
    """Send every item at its simulated time; wait for every answer; the records in the
    items' order (none unless ``keep``: ``on_done`` hears each as it comes). Each arrival
    sets the next one's timer (an hour of a large fleet is millions of requests: they are
    not all set at once)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    order = sorted(range(len(items)), key=lambda k: items[k].at_s)
    records: list[Record | None] = [None] * (len(items) if keep else 0)
    finished: asyncio.Future[None] = loop.create_future()
    left = [len(items)]

    def answered(i: int, record: Record) -> None:
        if keep:
            records[i] = record
        on_done(record)
        left[0] -= 1
        if not left[0]:
            finished.set_result(None)

    def arrive(k: int) -> None:
        i = order[k]
        item = items[i]
        if k + 1 < len(order):
            loop.call_at(start + items[order[k + 1]].at_s, arrive, k + 1)
        fleet.request(item, task, int(labels[item.sample]), input_bytes, policy,
                      functools.partial(answered, i))

    if order:
        loop.call_at(start + items[order[0]].at_s, arrive, 0)
        await finished
    return [r for r in records if r is not None]


def seeded(seed: int, *names: str) -> random.Random:
    """A generator of its own for each named part, all from one seed (a run is reproducible
    whatever order the parts draw in)."""
    return random.Random(f"{seed}:" + "/".join(names))
