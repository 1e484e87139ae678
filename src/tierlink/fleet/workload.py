"""A mixed, seeded workload and the open-loop driver that sends it through a fleet.

Each request comes from one device, with an SLA class (deadline + priority) and a privacy
level drawn from a documented mix. The driver sends at a steady rate (open loop: a slow
fleet does not slow the arrivals) and records what came back — including, for requests a
split plan served, the plan (``CUT/CODEC``) and where its time went.

A second, small workload sends photos for a large model (MobileNetV2, 602 KB inputs): one
SLA class and privacy level, origins in turn (:func:`make_photo_workload`);
:func:`summarize_split` reports it by how each request was served (local, remote, split).
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tierlink.core.types import NO_BILL, Bill, Priority, Privacy
from tierlink.errors import TierlinkError
from tierlink.node import protocol

# (deadline ms, priority, share): realtime inspection, interactive app, batch analytics.
SLA_CLASSES = ((30.0, Priority.REALTIME, 0.3), (150.0, Priority.INTERACTIVE, 0.4),
               (1000.0, Priority.BATCH, 0.3))
PRIVACY_MIX = ((Privacy.LOCAL, 0.2), (Privacy.SITE, 0.3), (Privacy.ANY, 0.5))
# The photo workload: an interactive app (half a second) whose photos may not leave the site.
PHOTO_SLA = (500.0, Priority.INTERACTIVE)
PHOTO_PRIVACY = Privacy.SITE
# Reported for split-served requests (medians of tierlink.timings_ms): the head on the
# device, encoding, the round trip to the tail's node (tail_ms of it upstream), the payload,
# and the policy's estimate of everything after the head.
SPLIT_TIMINGS = ("head_ms", "encode_ms", "tail_rtt_ms", "tail_ms", "split_bytes", "est_ms")


class PrivacyTally(NamedTuple):
    """A run's privacy figures, from the nodes' own counters: inputs a node received that it
    may not hold (``violations``: none from a tierlink fleet), and plans its router refused
    for moving an input further than its privacy allows (``refusals``)."""

    violations: int = 0
    refusals: int = 0

    def since(self, before: PrivacyTally) -> PrivacyTally:
        """What counters read now counted after they read ``before``."""
        return PrivacyTally(self.violations - before.violations,
                            self.refusals - before.refusals)


NONE_COUNTED = PrivacyTally()  # a run whose nodes' counters nobody read


@dataclass(frozen=True, slots=True)
class WorkItem:
    seq: int
    sample: int  # index into the test split
    origin: str  # device node id
    deadline_ms: float
    priority: Priority
    privacy: Privacy
    at_s: float  # send time, from the start of the run
    asynchronous: bool = False  # sent with tierlink.async: it may wait for cheaper prices


@dataclass(frozen=True, slots=True)
class Record:
    item: WorkItem
    label: int
    answered: bool
    lost: bool
    error: str  # error code when refused, "" when answered
    latency_ms: float
    pred: int = -1
    tier: str = ""
    served_by: str = ""
    cost: float = 0.0
    fallbacks: int = 0
    escalations: int = 0
    degraded: str = ""
    split: str = ""  # "CUT/CODEC" when a split plan served it
    timings: Mapping[str, float] = field(default_factory=dict)  # tierlink.timings_ms
    model_version: str = ""  # tierlink.model_version: the version that answered
    bill: Bill = NO_BILL  # what it cost by tier and part (the simulator's answers)

    @property
    def kind(self) -> str:
        """How it was served: ``split``, ``local`` (on its own device) or ``remote``."""
        if self.split:
            return "split"
        return "local" if self.served_by == self.item.origin else "remote"

    @property
    def correct(self) -> bool:
        return self.answered and self.pred == self.label

    @property
    def in_sla(self) -> bool:
        return self.answered and self.latency_ms <= self.item.deadline_ms


def _draw(rng: random.Random, table: tuple, weight_index: int) -> tuple:
    return rng.choices(table, weights=[row[weight_index] for row in table])[0]


def make_workload(n: int, rate_per_s: float, devices: list[str], n_samples: int,
                  seed: int) -> list[WorkItem]:
    return make_items([i / rate_per_s for i in range(n)], devices, n_samples, seed)


def make_items(times: Sequence[float], devices: Sequence[str], n_samples: int,
               seed: int) -> list[WorkItem]:
    """One request at each of ``times`` (s), in the demo's mix of SLA classes and privacy
    levels, from a device and on a test input drawn with ``seed``."""
    rng = random.Random(seed)
    items = []
    for i, at_s in enumerate(times):
        deadline, priority, _ = _draw(rng, SLA_CLASSES, 2)
        privacy, _ = _draw(rng, PRIVACY_MIX, 1)
        items.append(WorkItem(i, rng.randrange(n_samples), rng.choice(devices), deadline,
                              priority, privacy, at_s))
    return items


def make_photo_workload(n: int, rate_per_s: float, origins: Sequence[str], n_samples: int,
                        seed: int, deadline_ms: float = PHOTO_SLA[0]) -> list[WorkItem]:
    """``n`` photo requests at a steady rate, the origins taking turns (so each sees the
    same conditions), samples drawn with ``seed``; one SLA class and privacy level."""
    rng = random.Random(seed)
    deadline, priority = deadline_ms, PHOTO_SLA[1]
    return [WorkItem(i, rng.randrange(n_samples), origins[i % len(origins)], deadline,
                     priority, PHOTO_PRIVACY, i / rate_per_s) for i in range(n)]


async def drive(items: list[WorkItem], images: np.ndarray, labels: np.ndarray,
                device_urls: dict[str, str], task: str, policy: str | None,
                on_done: Callable[[Record], None] = lambda r: None,
                grace_s: float = 5.0, send_labels: bool = True,
                input_name: str = "input", tls: ssl.SSLContext | None = None,
                ) -> list[Record]:
    """Send every item at its time; wait for every answer (or error, or give up as lost).
    ``send_labels``: attach the true label (``tierlink.label``), so the hard examples the
    fleet collects from this run are labelled."""
    from tierlink.transport.client import OipClient

    async with OipClient(max_connections=256, tls=tls) as client:
        # An application keeps its connection to its device open: open it before the
        # clock starts, so the first request does not count the connection's setup.
        await asyncio.gather(*(client.ready(url) for url in set(device_urls.values())))
        start = time.monotonic()

        async def one(item: WorkItem) -> Record:
            await asyncio.sleep(max(0.0, start + item.at_s - time.monotonic()))
            record = await _send(client, item, images, labels, device_urls[item.origin], task,
                                 policy, grace_s, send_labels, input_name)
            on_done(record)
            return record

        return list(await asyncio.gather(*(one(i) for i in items)))


async def _send(client: object, item: WorkItem, images: np.ndarray, labels: np.ndarray,
                url: str, task: str, policy: str | None, grace_s: float,
                send_labels: bool = True, input_name: str = "input") -> Record:
    params = {protocol.DEADLINE: item.deadline_ms, protocol.PRIVACY: item.privacy.value,
              protocol.PRIORITY: item.priority.label, protocol.ORIGIN: item.origin}
    if policy:
        params[protocol.POLICY] = policy
    x = images[item.sample: item.sample + 1]  # (1, C, H, W)
    label = int(labels[item.sample])
    if send_labels:
        params[protocol.LABEL] = label
    t0 = time.monotonic()
    try:
        resp = await client.infer(url, task, {input_name: x}, params,  # type: ignore[attr-defined]
                                  timeout_s=item.deadline_ms / 1000.0 + grace_s)
    except TierlinkError as exc:
        # An error *answer* carries its HTTP status; without one, nothing came back: lost.
        lost = "status" not in exc.details
        return Record(item, label, False, lost, exc.code, (time.monotonic() - t0) * 1000)
    latency = (time.monotonic() - t0) * 1000.0
    out = protocol.parse_outcome(resp.parameters)
    return Record(item, label, True, False, "", latency,
                  pred=int(np.asarray(resp.outputs["label"]).reshape(-1)[0]),
                  tier=out.tier.label, served_by=out.served_by, cost=out.cost,
                  fallbacks=len(out.fallbacks), escalations=out.escalations,
                  degraded=out.degraded, split=out.split,
                  timings=_timings(resp.parameters.get(protocol.TIMINGS)),
                  model_version=str(resp.parameters.get("tierlink.model_version", "")))


def _timings(raw: object) -> dict[str, float]:
    """The answer's ``tierlink.timings_ms`` (JSON); empty when absent or unreadable."""
    try:
        data = json.loads(str(raw)) if raw else {}
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (ValueError, TypeError):
        return {}


def summarize(records: list[Record], privacy: PrivacyTally = NONE_COUNTED
              ) -> dict[str, object]:
    """The demo's per-run figures (the shape the issue's JSON asks for)."""
    tally = Tally()
    for record in records:
        tally.add(record)
    return tally.summary(privacy)


class Tally:
    """:func:`summarize`'s figures added up one record at a time, for a run that need not
    keep its records (the simulator's long runs: an hour of 10,000 devices is millions)."""

    def __init__(self) -> None:
        self.requests = self.answered = self.refused = self.lost = 0
        self.correct = self.in_sla = self.fallbacks = self.escalated = self.degraded = 0
        self.cost = 0.0
        self.tiers = dict.fromkeys(("device", "edge", "cloud"), 0)
        self.errors: dict[str, int] = {}
        self.latencies = array("d")  # of the answered requests

    def add(self, r: Record) -> None:
        self.requests += 1
        self.in_sla += r.in_sla
        if not r.answered:
            self.lost += r.lost
            self.refused += not r.lost
            self.errors[r.error] = self.errors.get(r.error, 0) + 1
            return
        self.answered += 1
        self.correct += r.correct
        self.latencies.append(r.latency_ms)
        self.cost += r.cost
        if r.tier in self.tiers:
            self.tiers[r.tier] += 1
        self.fallbacks += r.fallbacks
        self.escalated += r.escalations > 0
        self.degraded += bool(r.degraded)

    def summary(self, privacy: PrivacyTally = NONE_COUNTED) -> dict[str, object]:
        lat = np.asarray(self.latencies) if self.answered else np.array([0.0])
        n, answered = max(1, self.requests), max(1, self.answered)
        return {
            "requests": self.requests,
            "answered": self.answered,
            "refused": self.refused,
            "lost": self.lost,
            "accuracy": self.correct / answered,
            "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)),
            "p99_ms": float(np.percentile(lat, 99)),
            "sla_attainment": self.in_sla / n,
            "cost_per_1k": 1000.0 * self.cost / n,
            "tier_share": {t: k / answered for t, k in self.tiers.items()},
            "privacy_violations": privacy.violations,
            "privacy_refusals": privacy.refusals,
            "fallbacks": self.fallbacks,
            "escalated": self.escalated,
            "degraded": self.degraded,
            "errors": dict(self.errors),
        }


def summarize_split(records: list[Record], privacy: PrivacyTally = NONE_COUNTED
                    ) -> dict[str, object]:
    """The photo workload's figures: how each request was served (``split`` at which
    cut/codec, ``local``, ``remote``), latency overall and per kind, top-1 agreement with
    the unsplit model (``Record.label`` holds its answer), and for split-served requests
    the medians of the head time, the bytes sent and the policy's estimate."""
    answered = [r for r in records if r.answered]
    split = [r for r in answered if r.split]
    return {
        "requests": len(records),
        "answered": len(answered),
        "refused": sum(not r.answered and not r.lost for r in records),
        "lost": sum(r.lost for r in records),
        "served": {k: sum(r.kind == k for r in answered) for k in ("split", "local", "remote")},
        "split_plans": _count(r.split for r in split),
        "by_origin": {o: _count(r.kind for r in answered if r.item.origin == o)
                      for o in dict.fromkeys(r.item.origin for r in records)},
        **_percentiles(answered),
        "by_kind": {k: {"requests": len(rs), **_percentiles(rs)}
                    for k in ("split", "local", "remote")
                    if (rs := [r for r in answered if r.kind == k])},
        "sla_attainment": sum(r.in_sla for r in records) / max(1, len(records)),
        "agreement_top1": (sum(r.correct for r in answered) / len(answered)
                           if answered else None),
        "split_agreement_top1": sum(r.correct for r in split) / len(split) if split else None,
        "split_medians": {**{key: _median(r.timings.get(key) for r in split)
                             for key in SPLIT_TIMINGS},
                          "after_head_ms": _median(_after_head(r) for r in split)},
        "tiers": _count(r.tier for r in answered),
        "cost_per_1k": 1000.0 * sum(r.cost for r in answered) / max(1, len(records)),
        "privacy_violations": privacy.violations,
        "privacy_refusals": privacy.refusals,
        "errors": _count(r.error for r in records if not r.answered),
    }


def _after_head(record: Record) -> float | None:
    """Encode + the round trip to the tail's node: what the policy's ``est_ms`` estimates."""
    t = record.timings
    return t["encode_ms"] + t["tail_rtt_ms"] if "encode_ms" in t and "tail_rtt_ms" in t else None


def _percentiles(records: list[Record]) -> dict[str, float | None]:
    if not records:
        return {"p50_ms": None, "p95_ms": None}
    lat = np.array([r.latency_ms for r in records])
    return {"p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95))}


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None


def _count(codes: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for code in codes:
        out[code] = out.get(code, 0) + 1
    return out
