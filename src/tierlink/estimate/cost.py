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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tierlink.core.types import Bill, Tier

_GB = 1e9


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
    def from_mapping(cls, data: Mapping[str, Mapping[str, float]]) -> CostModel:
        """Build from config: ``{"compute_usd_per_s": {"cloud": ..}, "transfer_usd_per_gb": {..}}``."""
        compute = dict(_compute_prices())
        transfer = dict(_transfer_prices())
        for key, value in data.get("compute_usd_per_s", {}).items():
            compute[Tier.parse(key)] = float(value)
        for key, value in data.get("transfer_usd_per_gb", {}).items():
            transfer[Tier.parse(key)] = float(value)
        return cls(MappingProxyType(compute), MappingProxyType(transfer))

    def to_mapping(self) -> dict[str, dict[str, float]]:
        """The fleet file's ``cost:`` section (what ``from_mapping`` reads)."""
        return {"compute_usd_per_s": {t.label: p for t, p in self.compute_usd_per_s.items()},
                "transfer_usd_per_gb": {t.label: p
                                        for t, p in self.transfer_usd_per_gb.items()}}


DEFAULT_COST_MODEL = CostModel()
