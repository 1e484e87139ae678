"""What each model of a tuned cascade does on the inputs that reach it, by the path they
took: the joint figures a policy prices a cascade with. Pure numpy, no I/O.

A *path* is the models an input met, in order, each but the last having escalated it (its
confidence below its threshold): ``("fmnist-small-fp16", "fmnist-medium")`` is the edge
model on the inputs the device model passed on. Every ordered sub-sequence of the chain is
a path a fleet can take (an edge may forward without running its own model), so a 3-stage
chain has 7. For each, on the calibration split:

* ``share``: the share of all inputs that reach the last model this way;
* ``accuracy``: the last model's accuracy on them (answering all of them);
* ``threshold``, ``answered``, ``answered_accuracy``: for a model with a threshold, the
  share of those inputs it answers itself (confidence >= threshold) and its accuracy there.

The overall accuracy of a model is optimistic for the inputs a cascade escalates to it
(those are the hard ones); these records replace that guess with what was measured.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from tierlink.cascade.tune import Stage, check_stages
from tierlink.core.types import CascadeRecord
from tierlink.errors import ConfigError

SEP = ">"
RETUNE = "rerun `tierlink cascade tune FLEET_FILE` to write it anew"


def record_to_dict(record: CascadeRecord, digits: int | None = 4) -> dict[str, float]:
    """The fleet file's form of a record (``digits`` decimals; None: as it is)."""

    def num(value: float) -> float:
        return value if digits is None else round(value, digits)

    out = {"share": num(record.share), "accuracy": num(record.accuracy)}
    if record.threshold is not None:
        out |= {"threshold": num(record.threshold), "answered": num(record.answered or 0.0),
                "answered_accuracy": num(record.answered_accuracy or 0.0)}
    return out


RECORD_KEYS = ("share", "accuracy", "threshold", "answered", "answered_accuracy")


def record_from_dict(raw: Mapping[str, object], where: str) -> CascadeRecord:
    """A record as the fleet file holds it; ``ConfigError`` naming the field otherwise."""
    unknown = sorted(set(raw) - set(RECORD_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}",
                          hint=f"a record holds {', '.join(RECORD_KEYS)}; {RETUNE}")

    def num(key: str) -> float | None:
        value = raw.get(key)
        if value is None:
            return None
        try:
            out = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.{key} must be a number in [0, 1], got {value!r}",
                              hint=RETUNE) from None
        if not 0.0 <= out <= 1.0:
            raise ConfigError(f"{where}.{key} must lie in [0, 1], got {out}", hint=RETUNE)
        return out

    share, accuracy, threshold = num("share"), num("accuracy"), num("threshold")
    if share is None or accuracy is None:
        raise ConfigError(f"{where} needs share and accuracy", hint=RETUNE)
    if threshold is None:
        return CascadeRecord(share, accuracy)
    answered, answered_accuracy = num("answered"), num("answered_accuracy")
    if answered is None or answered_accuracy is None:
        raise ConfigError(f"{where} has a threshold but not answered / answered_accuracy",
                          hint=RETUNE)
    return CascadeRecord(share, accuracy, threshold, answered, answered_accuracy)


def path_key(models: Sequence[str]) -> str:
    return SEP.join(models)


def cascade_records(stages: Sequence[Stage], thresholds: Sequence[float]
                    ) -> dict[str, CascadeRecord]:
    """Records for every path through ``stages`` (device first) at ``thresholds``."""
    n = check_stages(stages)
    if len(thresholds) != len(stages) - 1:
        raise ConfigError(f"{len(stages)} stages take {len(stages) - 1} thresholds, got "
                          f"{len(thresholds)}")
    limit = {s.model: t for s, t in zip(stages, thresholds, strict=False)}
    out: dict[str, CascadeRecord] = {}
    for size in range(1, len(stages) + 1):
        for path in itertools.combinations(stages, size):
            reach = np.ones(n, dtype=bool)
            for earlier in path[:-1]:
                reach &= earlier.confidence < limit[earlier.model]
            out[path_key([s.model for s in path])] = _record(path[-1], reach,
                                                             limit.get(path[-1].model))
    return out


def _record(stage: Stage, reach: np.ndarray, threshold: float | None) -> CascadeRecord:
    m = int(reach.sum())
    share = m / len(reach)
    if m == 0:  # nothing reaches it: no evidence either way; its overall figure stands
        return CascadeRecord(0.0, float(stage.correct.mean()), threshold,
                             None if threshold is None else 0.0,
                             None if threshold is None else 1.0)
    accuracy = float(stage.correct[reach].mean())
    if threshold is None:
        return CascadeRecord(share, accuracy)
    took = reach & (stage.confidence >= threshold)
    k = int(took.sum())
    return CascadeRecord(share, accuracy, threshold, k / m,
                         float(stage.correct[took].mean()) if k else 1.0)


def parse_records(raw: Mapping[str, object], where: str
                  ) -> dict[tuple[str, ...], CascadeRecord]:
    """``routing.cascade.records`` as written by ``cascade tune``, keyed by path tuple."""
    out = {}
    for key, value in raw.items():
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}.{key} must be a mapping of figures", hint=RETUNE)
        path = tuple(str(key).split(SEP))
        if not all(path):
            raise ConfigError(f"{where}: {key!r} is not a path of model names "
                              f"(MODEL{SEP}MODEL...)", hint=RETUNE)
        out[path] = record_from_dict(value, f"{where}.{key}")
    return out
