"""Dynamic batching per model (fleet YAML ``batching:``): requests for the same model and
version that wait together run as one batch.

    batching:
      fmnist-large: {max_batch: 8, max_delay_ms: 2}

``max_batch``: the most requests one run takes (1: never batched, the default).
``max_delay_ms``: how long a request may be held, while a worker is free, for others to join
it — never longer than its deadline's slack allows, and never for a realtime request. 0
batches only what already waits (Triton's dynamic batcher without a queue delay).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tierlink.errors import ConfigError
from tierlink.settings.fields import as_float, as_int, as_mapping, known_keys

__all__ = ["BATCH_KEYS", "BatchSettings", "parse_batching"]

BATCH_KEYS = ("max_batch", "max_delay_ms")
MAX_BATCH = 256  # requests in one run at most


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How one model's requests are batched on every node that serves it."""

    max_batch: int = 1  # the most requests one run takes (1: never batched)
    max_delay_ms: float = 0.0  # hold a request this long for others to join (slack allowing)

    @property
    def on(self) -> bool:
        return self.max_batch > 1

    def to_dict(self) -> dict[str, Any]:
        return {"max_batch": self.max_batch, "max_delay_ms": self.max_delay_ms}


def parse_batching(raw: Any) -> Mapping[str, BatchSettings]:
    """The ``batching:`` section: a model name to its settings; unknown keys refused."""
    section = as_mapping(raw, "batching")
    return {str(name): _settings(entry, f"batching.{name}") for name, entry in section.items()}


def _settings(raw: Any, where: str) -> BatchSettings:
    entry = as_mapping(raw, where)
    known_keys(entry, BATCH_KEYS, where)
    max_batch = as_int(entry.get("max_batch", 1), f"{where}.max_batch", 1)
    if max_batch > MAX_BATCH:
        raise ConfigError(f"{where}.max_batch = {max_batch} is out of range [1, {MAX_BATCH}]")
    return BatchSettings(
        max_batch=max_batch,
        max_delay_ms=as_float(entry.get("max_delay_ms", 0.0), f"{where}.max_delay_ms",
                              0.0, 1000.0))
