"""The default cost model, applied identically to every run and every policy.

Prices (USD), documented in ``docs/cost-model.md``:

* cloud: one A100 on demand at $2.00 per hour (the seeds quote $1.5-3/h), charged per
  second of compute a request uses: $5.56e-4 per compute-second;
* edge: a consumer-GPU box (~$2,000 over 3 years, plus ~300 W at $0.15/kWh), ~$0.12/h:
  $3.4e-5 per compute-second;
* device: energy only, ~5 W at $0.15/kWh: $2.1e-7 per compute-second (the device is
  already paid for by its owner);
* transfer: the site's LAN is free; device or edge to cloud pays WAN transfer at
  $0.05 per GB (a typical inter-region / internet egress price).

Prices may change with the hour: a tier's **schedule** is a list of windows of the day
(UTC) in which its compute and transfer prices are multiplied by a factor (off-peak
discounts, peak surcharges); outside every window the factor is 1. ``at(day_s)`` is the
model priced for one moment, what placement uses for a snapshot taken then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tierlink.core.types import Bill, Tier

_GB = 1e9
DAY_S = 86_400


@dataclass(frozen=True, slots=True)
class PriceWindow:
    """A stretch of the day, ``[start_s, end_s)`` in seconds after midnight UTC (``start_s``
    in [0, 86,400), ``end_s`` in (0, 86,400]; it wraps past midnight when ``end_s <=
    start_s``), in which a tier's prices are multiplied by ``factor``."""

    start_s: int
    end_s: int
    factor: float

    def holds(self, day_s: float) -> bool:
        if self.start_s < self.end_s:
            return self.start_s <= day_s < self.end_s
        return day_s >= self.start_s or day_s < self.end_s

    @property
    def seconds(self) -> int:
        return (self.end_s - self.start_s) % DAY_S or DAY_S


def _no_schedule() -> Mapping[Tier, tuple[PriceWindow, ...]]:
    return MappingProxyType({})


def _compute_prices() -> Mapping[Tier, float]:
    return MappingProxyType({Tier.DEVICE: 2.1e-7, Tier.EDGE: 3.4e-5, Tier.CLOUD: 5.56e-4})


def _transfer_prices() -> Mapping[Tier, float]:
    # Keyed by the destination tier: uploads into the cloud cross the WAN.
    return MappingProxyType({Tier.DEVICE: 0.0, Tier.EDGE: 0.0, Tier.CLOUD: 0.05})


@dataclass(frozen=True, slots=True)
class CostModel:
    """USD per compute-second by tier and per GB transferred into a tier."""

    # By tier: USD per second of model compute a request uses there
    compute_usd_per_s: Mapping[Tier, float] = field(default_factory=_compute_prices)
    # By the tier the bytes go into: USD per GB sent (the site's LAN is free by default)
    transfer_usd_per_gb: Mapping[Tier, float] = field(default_factory=_transfer_prices)
    # By tier: windows of the day (UTC) whose factor multiplies that tier's prices
    schedule: Mapping[Tier, tuple[PriceWindow, ...]] = field(default_factory=_no_schedule)

    def factor(self, tier: Tier, day_s: float) -> float:
        """What ``tier``'s prices are multiplied by at ``day_s`` seconds after midnight."""
        for window in self.schedule.get(tier, ()):
            if window.holds(day_s % DAY_S):
                return window.factor
        return 1.0

    def at(self, day_s: float) -> CostModel:
        """This model priced at one moment of the day (no schedule left: flat prices)."""
        if not self.schedule:
            return self
        return CostModel(
            MappingProxyType({t: p * self.factor(t, day_s)
                              for t, p in self.compute_usd_per_s.items()}),
            MappingProxyType({t: p * self.factor(t, day_s)
                              for t, p in self.transfer_usd_per_gb.items()}))

    def changes(self) -> tuple[int, ...]:
        """The moments of the day (seconds after midnight) at which a price changes."""
        return tuple(sorted({s for ws in self.schedule.values() for w in ws
                             for s in (w.start_s, w.end_s % DAY_S)}))

    def compute(self, tier: Tier, ms: float) -> float:
        return self.compute_usd_per_s[tier] * ms / 1000.0

    def transfer(self, dst_tier: Tier, nbytes: int) -> float:
        return self.transfer_usd_per_gb[dst_tier] * nbytes / _GB

    def compute_bill(self, tier: Tier, ms: float) -> Bill:
        """The bill of ``ms`` of model compute at ``tier``."""
        return Bill.of_compute(tier, self.compute(tier, ms))

    def transfer_bill(self, dst_tier: Tier, nbytes: int) -> Bill:
        """The bill of sending ``nbytes`` into ``dst_tier``."""
        return Bill.of_transfer(dst_tier, self.transfer(dst_tier, nbytes))

    def split_bill(self, head_tier: Tier, head_ms: float, tail_tier: Tier, wire_bytes: int,
                   tail_ms: float) -> Bill:
        """A split plan's bill: the head's compute here, the features sent up, the tail's
        compute there (what the policy's estimate of the plan counts too)."""
        return (self.compute_bill(head_tier, head_ms) + self.transfer_bill(tail_tier, wire_bytes)
                + self.compute_bill(tail_tier, tail_ms))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> CostModel:
        """Build from config: ``{"compute_usd_per_s": {"cloud": ..}, "transfer_usd_per_gb":
        {..}, "schedule": {"cloud": [{"from": "22:00", "to": "06:00", "factor": 0.4}]}}``;
        ``ValueError`` naming what is wrong."""
        compute = dict(_compute_prices())
        transfer = dict(_transfer_prices())
        for key, value in data.get("compute_usd_per_s", {}).items():
            compute[Tier.parse(key)] = _price(value, f"compute_usd_per_s.{key}")
        for key, value in data.get("transfer_usd_per_gb", {}).items():
            transfer[Tier.parse(key)] = _price(value, f"transfer_usd_per_gb.{key}")
        schedule = {Tier.parse(key): _windows(value, f"schedule.{key}")
                    for key, value in (data.get("schedule") or {}).items()}
        return cls(MappingProxyType(compute), MappingProxyType(transfer),
                   MappingProxyType(schedule))

    def to_mapping(self) -> dict[str, Any]:
        """The fleet file's ``cost:`` section (what ``from_mapping`` reads)."""
        out: dict[str, Any] = {
            "compute_usd_per_s": {t.label: p for t, p in self.compute_usd_per_s.items()},
            "transfer_usd_per_gb": {t.label: p for t, p in self.transfer_usd_per_gb.items()}}
        if self.schedule:
            out["schedule"] = {t.label: [{"from": _clock(w.start_s), "to": _clock(w.end_s),
                                          "factor": w.factor} for w in ws]
                               for t, ws in self.schedule.items()}
        return out


DEFAULT_COST_MODEL = CostModel()


def _price(value: Any, where: str) -> float:
    price = float(value)
    if not price >= 0.0:
        raise ValueError(f"{where} must be a price >= 0, got {value!r}")
    return price


def _windows(raw: Any, where: str) -> tuple[PriceWindow, ...]:
    """A tier's windows: a list of ``{from: "HH:MM", to: "HH:MM", factor: x}``, none
    overlapping another."""
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise TypeError(f"{where} must be a list of {{from, to, factor}}")
    windows = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping) or set(item) != {"from", "to", "factor"}:
            raise ValueError(f"{at} must be {{from: HH:MM, to: HH:MM, factor: x}}, got {item!r}")
        factor = float(item["factor"])
        if not factor > 0.0:
            raise ValueError(f"{at}.factor must be > 0, got {item['factor']!r}")
        # a window starts in [00:00, 24:00) and ends in (00:00, 24:00]: "to: 00:00" is
        # midnight at the day's end, "00:00"-"24:00" the whole day
        window = PriceWindow(_seconds(item["from"], f"{at}.from") % DAY_S,
                             _seconds(item["to"], f"{at}.to") or DAY_S, factor)
        if window.start_s == window.end_s:
            raise ValueError(f"{at} is empty: from and to are the same time")
        windows.append(window)
    for i, a in enumerate(windows):
        for b in windows[i + 1:]:
            if a.holds(b.start_s) or b.holds(a.start_s):
                raise ValueError(f"{where}: the windows from {_clock(a.start_s)} and from "
                                 f"{_clock(b.start_s)} overlap")
    return tuple(windows)


def _seconds(text: Any, where: str) -> int:
    """``"HH:MM"`` as seconds after midnight, 0 to 86,400 (``"24:00"``)."""
    parts = str(text).split(":")
    try:
        hours, minutes = (int(parts[0]), int(parts[1])) if len(parts) == 2 else (-1, -1)
    except ValueError:
        hours = minutes = -1
    if not (0 <= hours <= 24 and 0 <= minutes < 60) or (hours == 24 and minutes):
        raise ValueError(f"{where} must be a time of day HH:MM (UTC), got {text!r}")
    return hours * 3600 + minutes * 60


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"
