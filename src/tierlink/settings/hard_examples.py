"""The hard-example loop's settings (fleet YAML ``hard_examples:`` and ``control.tier``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.settings.fields import as_float, as_int, as_mapping, as_tier, known

__all__ = ["HardExampleConfig", "parse_hard_examples"]


@dataclass(frozen=True, slots=True)
class HardExampleConfig:
    """What a node does with inputs it escalated for low confidence. ``store_tier`` is the
    control plane's tier (``control.tier``): an input is sent only if its privacy level lets
    a node of that tier hold it."""

    enabled: bool = True  # off: a node sends none (nothing leaves it for retraining)
    sample_rate: float = 1.0  # share of eligible examples sent (seeded draw per example)
    max_queue: int = 1000  # examples waiting on the node; when full the oldest is dropped
    batch_size: int = 64  # flush as soon as this many wait ...
    flush_interval_s: float = 1.0  # ... or at least this often
    store_tier: Tier = Tier.CLOUD

    def to_dict(self) -> dict[str, Any]:
        """The ``hard_examples:`` section (``store_tier`` is the fleet's ``control.tier``)."""
        return {"enabled": self.enabled, "sample_rate": self.sample_rate,
                "max_queue": self.max_queue, "batch_size": self.batch_size,
                "flush_interval_s": self.flush_interval_s}


def parse_hard_examples(raw: Any, control_tier: str | Tier = "cloud") -> HardExampleConfig:
    """The ``hard_examples:`` section (and ``control.tier``), e.g. from a node spec file."""
    raw = as_mapping(raw, "hard_examples")
    for key in raw:
        known(key, ("enabled", "sample_rate", "max_queue", "batch_size", "flush_interval_s"),
              "hard_examples")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"hard_examples.enabled must be true or false, got {enabled!r}")
    return HardExampleConfig(
        enabled=enabled,
        sample_rate=as_float(raw.get("sample_rate", 1.0), "hard_examples.sample_rate", 0.0, 1.0),
        max_queue=as_int(raw.get("max_queue", 1000), "hard_examples.max_queue", 1),
        batch_size=as_int(raw.get("batch_size", 64), "hard_examples.batch_size", 1),
        flush_interval_s=as_float(raw.get("flush_interval_s", 1.0),
                                  "hard_examples.flush_interval_s", 0.01),
        store_tier=as_tier(control_tier, "control.tier"),
    )
