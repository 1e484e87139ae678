"""A run's figures (the demo's, the simulator's) broken down by privacy level and by SLA
class, and the live escalation rate beside the one the cascade thresholds predict.

A request *may escalate* when its privacy level lets it leave the device (``site`` or
``any``). The thresholds predict, for those requests, the share the device model passes on:
``escalated_share_tuned`` is that share on the calibration split (what ``cascade tune``
promised), ``escalated_share_expected`` the same rule applied to the very inputs sent (the
device model's calibrated confidence on each, below its threshold). ``escalated_share`` is
what happened: the share of those requests answered off the device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierlink.core.types import Privacy
from tierlink.fleet.config import FleetConfig
from tierlink.fleet.workload import Record

TIERS = ("device", "edge", "cloud")


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the device model's threshold predicts. ``tuned``: the share of the calibration
    split below the threshold; ``below``: per test-split sample, whether its calibrated
    confidence is below the threshold (indexed by ``WorkItem.sample``)."""

    threshold: float
    tuned: float
    below: np.ndarray

    def expected(self, samples: Iterable[int]) -> float | None:
        picked = [bool(self.below[s]) for s in samples]
        return sum(picked) / len(picked) if picked else None


def cloud_room_ms(fleet: FleetConfig) -> float:
    """The least deadline that leaves room for the cloud: the slowest device->edge and
    edge->cloud round trips declared, plus the routing reserve."""
    tier = {n.node_id: n.tier.label for n in fleet.nodes}
    rtt = {pair: max((2 * l.delay_ms for l in fleet.links
                      if (tier[l.src], tier[l.dst]) == pair), default=0.0)
           for pair in (("device", "edge"), ("edge", "cloud"))}
    return sum(rtt.values()) + fleet.routing.reserve_ms


def breakdown(records: list[Record], fleet: FleetConfig,
              prediction: Prediction | None) -> dict[str, Any]:
    """The per-privacy and per-SLA figures of one run, the ``any`` requests by whether the
    cloud was within reach, and the escalation rate beside the thresholds' prediction."""
    return {"by_privacy": by_privacy(records), "by_sla": by_sla(records),
            "any_by_cloud_room": by_privacy_and_room(records, cloud_room_ms(fleet)),
            "cloud_room_ms": cloud_room_ms(fleet),
            "escalation": escalation(records, prediction)}


def group_figures(records: list[Record]) -> dict[str, object]:
    """Accuracy, p95, SLA attainment, cost, tier shares and escalations of one group."""
    answered = [r for r in records if r.answered]
    n = max(1, len(records))
    lat = np.array([r.latency_ms for r in answered]) if answered else None
    return {
        "requests": len(records),
        "accuracy": sum(r.correct for r in answered) / max(1, len(answered)),
        "p95_ms": float(np.percentile(lat, 95)) if lat is not None else None,
        "sla_attainment": sum(r.in_sla for r in records) / n,
        "cost_per_1k": 1000.0 * sum(r.cost for r in answered) / n,
        "tier_share": {t: sum(r.tier == t for r in answered) / max(1, len(answered))
                       for t in TIERS},
        "escalated_share": sum(_left_device(r) for r in answered) / max(1, len(answered)),
        "degraded": sum(bool(r.degraded) for r in answered),
    }


def by_privacy(records: list[Record]) -> dict[str, dict[str, object]]:
    return _grouped(records, lambda r: r.item.privacy.value,
                    [p.value for p in Privacy])


def by_sla(records: list[Record]) -> dict[str, dict[str, object]]:
    """Keyed by the class's priority label (``realtime``, ``interactive``, ``batch``), each
    with its deadline."""
    groups = _grouped(records, lambda r: r.item.priority.label,
                      sorted({r.item.priority.label for r in records},
                             key=lambda k: _deadline(records, k)))
    return {k: {**g, "deadline_ms": _deadline(records, k)} for k, g in groups.items()}


def _deadline(records: list[Record], label: str) -> float:
    return max(r.item.deadline_ms for r in records if r.item.priority.label == label)


def by_privacy_and_room(records: list[Record], cloud_room_ms: float
                        ) -> dict[str, dict[str, object]]:
    """``any`` requests split by whether their deadline leaves room for the cloud
    (``deadline >= cloud_room_ms``): only those can ever be answered there."""
    anyp = [r for r in records if r.item.privacy is Privacy.ANY]
    return {"cloud_reachable": group_figures(
                [r for r in anyp if r.item.deadline_ms >= cloud_room_ms]),
            "cloud_out_of_reach": group_figures(
                [r for r in anyp if r.item.deadline_ms < cloud_room_ms])}


def escalation(records: list[Record], prediction: Prediction | None) -> dict[str, object]:
    """The live escalation rate of the requests that may escalate, beside the prediction."""
    may = [r for r in records if r.item.privacy is not Privacy.LOCAL]
    answered = [r for r in may if r.answered]
    out: dict[str, object] = {
        "may_escalate": len(may),
        "escalated_share": (sum(_left_device(r) for r in answered) / len(answered)
                            if answered else None),
        "escalation_degraded": sum(bool(r.degraded) and r.tier == "device" for r in answered),
    }
    if prediction is not None:
        out |= {"threshold": prediction.threshold,
                "escalated_share_tuned": prediction.tuned,
                "escalated_share_expected": prediction.expected(r.item.sample for r in may)}
    return out


def _left_device(record: Record) -> bool:
    return record.answered and record.tier != "device"


def _grouped(records: list[Record], key: Callable[[Record], str],
             order: list[str]) -> dict[str, dict[str, object]]:
    groups: Mapping[str, list[Record]] = {k: [r for r in records if key(r) == k]
                                          for k in order}
    return {k: group_figures(rs) for k, rs in groups.items() if rs}
