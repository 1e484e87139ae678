"""The fleet as an operator looks at it (`GET /v1/fleet`, the `/ui` page): every node by tier
and site with its health, load, versions and links; what the fleet did over the last
minutes (requests, SLA attainment, tier shares, escalation rate, confidence drift and
agreement with the most capable model per model version); rollouts; open breakers; hard examples;
each node process's CPU share, resident memory and open files, and its battery and heat
where it reports them.

Nodes report cumulative counts in their heartbeats; ``FleetView`` samples the registry
(every ``sample_s``) and makes rates from the difference between now and the oldest sample
inside the window. A node that stops heartbeating stays on the page as ``down`` (for
``forget_s``) instead of vanishing, so a dead node is seen, not missed. Each control-plane
replica keeps its own samples; they read the same registry and so show the same fleet.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tierlink.control.schemas import NodeRecord

Clock = Callable[[], float]
HEALTHY_AGE_S = 3.0  # a heartbeat within this: healthy; older but not expired: late
_BINS = 10  # version stats' confidence histogram: ten equal bins over [0, 1]


class _Version(NamedTuple):
    """One model version's cumulative counters on one node (its heartbeat's stats)."""

    requests: int = 0
    escalations: int = 0
    confidence: tuple[int, ...] = ()
    mirrored: int = 0
    agreed: int = 0


@dataclass(frozen=True, slots=True)
class _Counts:
    """One node's cumulative counters at one sample."""

    started_at: float
    traffic: Mapping[str, Any]
    versions: Mapping[tuple[str, str], _Version]
    cpu_seconds: float | None = None  # the process's, when its heartbeat says


@dataclass(slots=True)
class _Sample:
    at: float
    nodes: dict[str, _Counts] = field(default_factory=dict)


def _counts(record: NodeRecord) -> _Counts:
    versions: dict[tuple[str, str], _Version] = {}
    for m in record.models:
        stats = m.stats or {}
        versions[(m.name, m.version)] = _Version(
            int(stats.get("requests", 0)), int(stats.get("escalations", 0)),
            tuple(stats.get("confidence_buckets", ()) or ()), int(stats.get("mirrored", 0)),
            int(stats.get("agreed", 0)))
    return _Counts(record.started_at, record.traffic.model_dump(), versions,
                   record.process.cpu_seconds if record.process else None)


class FleetView:
    """Samples of the registry and the snapshot built from them (see the module doc)."""

    def __init__(self, alive: Callable[[], tuple[float, list[NodeRecord]]], clock: Clock,
                 ttl_s: float, *, window_s: float = 300.0, sample_s: float = 5.0,
                 forget_s: float = 600.0,
                 rollouts: Callable[[], list[dict[str, Any]]] = list,
                 hard_examples: Callable[[], int | None] = lambda: None,
                 routing: Callable[[], int | None] = lambda: None) -> None:
        self._alive, self._clock, self.ttl_s = alive, clock, ttl_s
        self.window_s, self.sample_s, self.forget_s = window_s, sample_s, forget_s
        self._rollouts, self._hard_examples = rollouts, hard_examples
        self._routing = routing  # the routing revision the control plane hands out
        self._samples: deque[_Sample] = deque()
        self._last: dict[str, NodeRecord] = {}  # every node seen, its latest record
        self.closed = asyncio.Event()  # set when the server stops: live streams end

    def close(self) -> None:
        self.closed.set()

    def snapshot(self) -> dict[str, Any]:
        now, records = self._alive()
        first, last = self._sample(now, records)
        alive = {r.node_id for r in records}
        cpu = _cpu_shares(self._samples, last)
        nodes = [_node(r, now, r.node_id in alive, cpu.get(r.node_id))
                 for r in self._last.values()]
        nodes.sort(key=lambda n: (_TIER_ORDER.get(n["tier"], 9), n["site"], n["node_id"]))
        return {"at": now, "ttl_s": self.ttl_s, "window_s": round(last.at - first.at, 3),
                "nodes": nodes, "tiers": _tiers(nodes),
                "traffic": _traffic(first, last), "models": _models(first, last),
                "rollouts": self._rollouts()[:10], "hard_examples": self._hard_examples(),
                "routing_revision": self._routing(),
                "breakers_open": sum(len(n["breakers_open"]) for n in nodes)}

    async def run(self) -> None:
        """Sample on a fixed cadence while nobody looks, so the first look has a window."""
        while not self.closed.is_set():
            self.snapshot()
            try:
                await asyncio.wait_for(self.closed.wait(), self.sample_s)
            except TimeoutError:
                pass

    def _sample(self, now: float, records: list[NodeRecord]) -> tuple[_Sample, _Sample]:
        """Remember the records; (the oldest sample of the window, this one). Samples are
        kept ``sample_s`` apart, the one just before the window's start included."""
        for r in records:
            self._last[r.node_id] = r
        for node_id in [n for n, r in self._last.items() if now - r.last_seen > self.forget_s]:
            del self._last[node_id]
        sample = _Sample(now, {r.node_id: _counts(r) for r in records})
        if not self._samples or now - self._samples[-1].at >= self.sample_s:
            self._samples.append(sample)
        while len(self._samples) > 1 and now - self._samples[1].at >= self.window_s:
            self._samples.popleft()
        return self._samples[0], sample


_TIER_ORDER = {"cloud": 0, "edge": 1, "device": 2}


def _health(record: NodeRecord, now: float, alive: bool) -> str:
    if not alive:
        return "down"
    if record.draining:
        return "draining"
    return "healthy" if now - record.last_seen <= HEALTHY_AGE_S else "late"


def _cpu_shares(samples: deque[_Sample], last: _Sample) -> dict[str, float]:
    """Per node, the share of one core its process used over the window: since the oldest
    sample of this incarnation (a node new in the window, or restarted, has one from its
    second sample on)."""
    out = {}
    first = samples[0] if samples else last
    for node_id, now in last.nodes.items():
        if now.cpu_seconds is None:
            continue
        before = first.nodes.get(node_id)
        at = first.at
        if before is None or before.started_at != now.started_at:  # rare: scan for it
            at, before = next(((s.at, b) for s in samples
                               if (b := s.nodes.get(node_id)) is not None
                               and b.started_at == now.started_at), (last.at, None))
        if before is not None and before.cpu_seconds is not None and last.at > at:
            out[node_id] = round(max(now.cpu_seconds - before.cpu_seconds, 0.0)
                                 / (last.at - at), 4)
    return out


def _process(r: NodeRecord, cpu_share: float | None) -> dict[str, Any] | None:
    if r.process is None:
        return None
    return {"cpu_share": cpu_share, "cpu_seconds": r.process.cpu_seconds,
            "resident_mib": round(r.process.resident_bytes / 2**20, 1),
            "open_fds": r.process.open_fds}


def _node(r: NodeRecord, now: float, alive: bool,
          cpu_share: float | None = None) -> dict[str, Any]:
    return {"node_id": r.node_id, "tier": r.tier, "site": r.labels.get("site", ""),
            "labels": dict(r.labels), "health": _health(r, now, alive),
            "age_s": round(max(now - r.last_seen, 0.0), 3), "address": r.address,
            "queue_depth": r.queue_depth, "inflight": r.inflight, "workers": r.workers,
            "models": [{"name": m.name, "version": m.version, "task": m.task,
                        "role": m.role, "weight": m.weight} for m in r.models],
            "links": [{"dst": l.dst, "rtt_ms": l.rtt_ms, "bandwidth_mbit": l.bandwidth_mbit}
                      for l in r.links],
            "breakers_open": list(r.breakers_open), "outbox_pending": r.outbox_pending,
            "software": r.software, "generation": r.generation,
            "routing_revision": r.routing_revision, "process": _process(r, cpu_share),
            "device_state": r.device_state.model_dump(exclude={"extra"})
            if r.device_state else None}


def _tiers(nodes: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for n in nodes:
        t = out.setdefault(n["tier"], {"nodes": 0, "healthy": 0, "down": 0})
        t["nodes"] += 1
        t["healthy"] += n["health"] == "healthy"
        t["down"] += n["health"] == "down"
    return out


def _grew(new: Any, old: Any) -> int:
    """How much a cumulative count grew (never negative)."""
    return max(int(new or 0) - int(old or 0), 0)


def _traffic(first: _Sample, last: _Sample) -> dict[str, Any]:
    span = last.at - first.at
    totals = dict.fromkeys(("met", "missed", "refused", "failed", "escalated"), 0)
    served: dict[str, int] = {}
    for node_id, now in (last.nodes.items() if span > 0 else ()):
        before = first.nodes.get(node_id)
        # A node new in the window, or restarted (a new started_at), counts from zero.
        old = before.traffic if before is not None and before.started_at == now.started_at \
            else {}
        for key in totals:
            totals[key] += _grew(now.traffic.get(key), old.get(key))
        old_served = old.get("served") or {}
        for tier, n in (now.traffic.get("served") or {}).items():
            served[tier] = served.get(tier, 0) + _grew(n, old_served.get(tier))
    requests = totals["met"] + totals["missed"] + totals["refused"] + totals["failed"]
    answered = sum(served.values())
    return {"requests": requests, "rate_per_s": round(requests / span, 3) if span > 0 else 0.0,
            "sla_attainment": round(totals["met"] / requests, 4) if requests else None,
            "refused": totals["refused"], "failed": totals["failed"],
            "shares": {t: round(n / answered, 4) for t, n in sorted(served.items())}
            if answered else {},
            "escalation_rate": round(totals["escalated"] / answered, 4) if answered else None}


def _mean_confidence(buckets: Iterable[int]) -> float | None:
    counts = list(buckets)
    total = sum(counts)
    if not total:
        return None
    return sum((i + 0.5) / _BINS * c for i, c in enumerate(counts)) / total


def _models(first: _Sample, last: _Sample) -> list[dict[str, Any]]:
    """Per model version over every node: requests in the window, the mean confidence in
    the window against its mean since the nodes started serving it (the drift), and the
    share of its mirrored samples the most capable model agreed with in the window."""
    window: dict[tuple[str, str], list[int]] = {}
    lifetime: dict[tuple[str, str], list[int]] = {}
    counts: dict[tuple[str, str], list[int]] = {}  # requests, escalations, mirrored, agreed
    for node_id, now in last.nodes.items():
        before = first.nodes.get(node_id)
        same = before is not None and before.started_at == now.started_at
        for key, v in now.versions.items():
            old = (before.versions.get(key) if same and before is not None else None) \
                or _Version()
            add = counts.setdefault(key, [0, 0, 0, 0])
            for i, (n, o) in enumerate(((v.requests, old.requests),
                                        (v.escalations, old.escalations),
                                        (v.mirrored, old.mirrored), (v.agreed, old.agreed))):
                add[i] += max(n - o, 0)
            life = lifetime.setdefault(key, [0] * _BINS)
            win = window.setdefault(key, [0] * _BINS)
            for i, c in enumerate(v.confidence[:_BINS]):
                life[i] += c
                win[i] += max(c - (old.confidence[i] if i < len(old.confidence) else 0), 0)
    out = []
    for (name, version), (n, esc, mirrored, agreed) in sorted(counts.items()):
        now_c = _mean_confidence(window[(name, version)])
        base = _mean_confidence(lifetime[(name, version)])
        out.append({"name": name, "version": version, "requests": n,
                    "escalation_rate": round(esc / n, 4) if n else None,
                    "confidence": None if now_c is None else round(now_c, 4),
                    "confidence_baseline": None if base is None else round(base, 4),
                    "drift": None if now_c is None or base is None else round(now_c - base, 4),
                    "mirrored": mirrored,
                    "agreement": round(min(agreed, mirrored) / mirrored, 4) if mirrored
                    else None})
    return out
