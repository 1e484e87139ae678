"""What a split plan's head costs on this node: the head profiles (timed on an unthrottled
core, beside the model card) priced at the node's real speed, learned from the scheduler's
service times. Shared by the node (``node/service.py``) and the simulator (``sim/node.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import replace

from tierlink.core.types import ModelView, SplitPoint

__all__ = ["head_factor", "head_key", "scale_heads", "scaled"]


def scale_heads(heads: tuple[ModelView, ...], card_ms: Mapping[str, float],
                service_ms: Mapping[str, float]) -> tuple[ModelView, ...]:
    """Head profiles priced at this node's real speed: :func:`head_factor` applied to
    every head latency and codec encode time (the profile as is when it is within 5%)."""
    return scaled(heads, head_factor(heads, card_ms, service_ms))


def scaled(heads: tuple[ModelView, ...], factor: float) -> tuple[ModelView, ...]:
    if not heads or abs(factor - 1.0) < 0.05:
        return heads
    return tuple(replace(h, splits=tuple(_slower(p, factor) for p in h.splits))
                 for h in heads)


def head_factor(heads: tuple[ModelView, ...], card_ms: Mapping[str, float],
                service_ms: Mapping[str, float]) -> float:
    """This node's slowdown against the profiles (a CPU quota, a busy machine), on a 2%
    grid so that a view's heads stay the same objects while it holds (the policy caches
    its pricing per profile). Profiles are timed on an unthrottled core; the median ratio
    of what this node really takes (the scheduler's service times, learned from every
    call) to what was profiled. The ratios come from the whole models run here against
    their cards; a node that runs none (a camera holding only heads) uses the head cuts it
    has run against the profile's time for each. Whole models first because they keep
    being run whatever the policy picks: a head's figure is only renewed while the policy
    keeps picking that cut, so one measured in a bad moment would otherwise keep every
    split looking slow for good."""
    ratios = [service_ms[name] / ms for name, ms in card_ms.items()
              if name in service_ms and ms > 0]
    ratios = ratios or [service_ms[key] / p.head_ms for h in heads for p in h.splits
                        if (key := head_key(h.name, p.cut)) in service_ms and p.head_ms > 0]
    median = statistics.median(ratios) if ratios else 0.0
    return _FACTOR_GRID ** round(math.log(median, _FACTOR_GRID)) if median > 0 else 1.0


_FACTOR_GRID = 1.02


def head_key(model: str, cut: str) -> str:
    """The scheduler key a split's head runs under (its learned service time)."""
    return f"{model}@head:{cut}"


def _slower(point: SplitPoint, factor: float) -> SplitPoint:
    return replace(point, head_ms=point.head_ms * factor,
                   codecs=tuple(replace(c, encode_ms=c.encode_ms * factor)
                                for c in point.codecs))
