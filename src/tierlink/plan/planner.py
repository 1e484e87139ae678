"""Capacity and cost planning (pure): each use case on the cheapest hardware that holds its
data where its privacy says and answers within its latency target, sized on P95 load with
headroom — never on the peak — with its monthly cost; training runs sized by 6·N·D.

Costs per month: a rented (cloud) instance is its hourly price; a bought (edge) box is its
price over its lifetime plus its power; a device is already paid for, so it costs the
energy of the compute it does; moving inputs into the cloud costs transfer. The baselines a
team would reach for without tierlink — everything in the cloud, everything at the edge —
are planned the same way, with the privacy they break and the latency they miss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tierlink.core.types import Tier
from tierlink.plan.inventory import Hardware, Inventory, Training, UseCase

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class Placed:
    use_case: str
    tier: str  # "" when nothing can serve it
    hardware: str
    instances: int
    latency_ms: float
    monthly_usd: float
    costs: dict[str, float] = field(default_factory=dict)
    privacy_ok: bool = True
    sla_ok: bool = True
    why: str = ""


@dataclass(frozen=True, slots=True)
class TrainingRun:
    use_case: str
    flops: float
    gpu_hours: float
    cards: int  # to finish in the run's days
    hardware: str
    usd_per_run: float


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    placed: tuple[Placed, ...]
    training: tuple[TrainingRun, ...]

    @property
    def monthly_usd(self) -> float:
        return sum(p.monthly_usd for p in self.placed) + sum(t.usd_per_run
                                                            for t in self.training)

    def by_tier(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for p in self.placed:
            tier = out.setdefault(p.tier or "unplaced", {"instances": 0, "monthly_usd": 0.0})
            tier["instances"] += p.instances
            tier["monthly_usd"] += p.monthly_usd
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "monthly_usd": round(self.monthly_usd, 2),
                "by_tier": {k: {"instances": int(v["instances"]),
                                "monthly_usd": round(v["monthly_usd"], 2)}
                            for k, v in self.by_tier().items()},
                "privacy_violations": [p.use_case for p in self.placed if not p.privacy_ok],
                "sla_misses": [p.use_case for p in self.placed if not p.sla_ok],
                "use_cases": [{"name": p.use_case, "tier": p.tier, "hardware": p.hardware,
                               "instances": p.instances,
                               "latency_ms": round(p.latency_ms, 2),
                               "monthly_usd": round(p.monthly_usd, 2),
                               "costs": {k: round(v, 2) for k, v in p.costs.items()},
                               "privacy_ok": p.privacy_ok, "sla_ok": p.sla_ok, "why": p.why}
                              for p in self.placed],
                "training": [{"use_case": t.use_case, "flops": t.flops,
                              "gpu_hours": round(t.gpu_hours, 2), "cards": t.cards,
                              "hardware": t.hardware, "usd_per_run": round(t.usd_per_run, 2)}
                             for t in self.training]}


def option(inv: Inventory, uc: UseCase, hw: Hardware) -> Placed | None:
    """``uc`` served by ``hw`` (None: ``hw`` has no throughput figure for its model)."""
    tp = hw.throughput.get(uc.model)
    if tp is None or tp.per_s <= 0:
        return None
    service_s = (max(uc.output_tokens, 1) / tp.per_s) if tp.tokens else 1.0 / tp.per_s
    capacity = 1.0 / service_s  # requests per second one instance serves
    load = uc.p95_rps * (1.0 + inv.headroom)
    month_s = inv.hours_per_month * SECONDS_PER_HOUR
    busy_s = uc.p95_rps * month_s * service_s  # compute-seconds a month at P95
    costs: dict[str, float] = {}
    if hw.tier is Tier.DEVICE:
        if uc.devices <= 0:
            return None
        instances = uc.devices
        costs["energy"] = busy_s * hw.power_w / 3.6e6 * inv.energy_usd_per_kwh
        overloaded = load / uc.devices > capacity
    else:
        instances = max(1, math.ceil(load / capacity))
        if hw.price_per_hour:
            costs["compute"] = instances * hw.price_per_hour * inv.hours_per_month
        if hw.price_usd:
            costs["amortisation"] = instances * hw.price_usd / max(hw.lifetime_months, 1e-9)
            costs["energy"] = (instances * hw.power_w * inv.hours_per_month / 1000.0
                               * inv.energy_usd_per_kwh)
        overloaded = False
    if hw.tier is Tier.CLOUD and uc.input_bytes:
        costs["transfer"] = uc.p95_rps * month_s * uc.input_bytes / 1e9 * inv.transfer_usd_per_gb
    latency = inv.rtt_ms.get(hw.tier, 0.0) + 1000.0 * service_s
    privacy_ok = uc.privacy.allows(hw.tier, at_origin=hw.tier is Tier.DEVICE)
    sla_ok = latency <= uc.latency_ms and not overloaded
    why = [] if privacy_ok else [f"a {uc.privacy.value} input may not reach the {hw.tier.label}"]
    if latency > uc.latency_ms:
        why.append(f"{latency:.0f} ms > the {uc.latency_ms:.0f} ms target")
    if overloaded:
        why.append(f"{load / uc.devices:.1f} req/s per device > its {capacity:.1f}")
    return Placed(uc.name, hw.tier.label, hw.name, instances, latency, sum(costs.values()),
                  costs, privacy_ok, sla_ok, "; ".join(why))


def training_run(inv: Inventory, uc: UseCase, t: Training) -> TrainingRun | None:
    """6·N·D FLOPs on the catalogue's cheapest cloud hardware with a FLOPs figure."""
    flops = 6.0 * t.params * t.tokens
    runs = []
    for hw in inv.hardware:
        if hw.tier is Tier.CLOUD and hw.flops > 0:
            hours = flops / (hw.flops * t.mfu) / SECONDS_PER_HOUR
            runs.append(TrainingRun(uc.name, flops, hours,
                                    max(1, math.ceil(hours / (24.0 * t.days))), hw.name,
                                    hours * hw.price_per_hour))
    return min(runs, key=lambda r: r.usd_per_run, default=None)


def plan(inv: Inventory) -> Plan:
    """Each use case where it may run and meets its target, cheapest first."""
    return Plan("plan", tuple(_best(inv, uc, None) for uc in inv.use_cases if uc.model),
                _training(inv))


def fixed(inv: Inventory, tier: Tier) -> Plan:
    """Everything on ``tier`` (its cheapest hardware per use case), whatever privacy and
    latency say: what a team without placement would run."""
    return Plan(f"all_{tier.label}", tuple(_best(inv, uc, tier) for uc in inv.use_cases
                                           if uc.model), _training(inv))


def _best(inv: Inventory, uc: UseCase, tier: Tier | None) -> Placed:
    options = [o for hw in inv.hardware if tier is None or hw.tier is tier
               if (o := option(inv, uc, hw)) is not None]
    if tier is None:
        good = [o for o in options if o.privacy_ok and o.sla_ok]
        if good:
            return min(good, key=lambda o: (o.monthly_usd, o.latency_ms))
        allowed = [o for o in options if o.privacy_ok]
        if allowed:  # the best it can do: the fastest allowed, said to miss
            return min(allowed, key=lambda o: (o.latency_ms, o.monthly_usd))
        return Placed(uc.name, "", "", 0, math.inf, 0.0, privacy_ok=False, sla_ok=False,
                      why=f"no hardware that a {uc.privacy.value} input may reach serves "
                          f"{uc.model}")
    if options:
        return min(options, key=lambda o: (not o.sla_ok, o.monthly_usd))
    return Placed(uc.name, "", "", 0, math.inf, 0.0, sla_ok=False,
                  why=f"no {tier.label} hardware serves {uc.model}")


def _training(inv: Inventory) -> tuple[TrainingRun, ...]:
    return tuple(run for uc in inv.use_cases if uc.training is not None
                 if (run := training_run(inv, uc, uc.training)) is not None)
