"""Per-node split profiles: how long every head and tail segment of a model takes here.

``profile_model`` cuts the model at each single-tensor cut point
(:func:`tierlink.split.partition.cut_points`), and times head and tail on this machine with
one ONNX Runtime thread, batch 1, interleaving the segments round by round so drift hits
them alike. The result is saved beside the model card as ``<model>.splits.json`` and read
by the node, which reports it with its heartbeat (``ModelView.splits``) so any policy can
price a split plan: the device prices heads with its own profile and tails with the
upstream's.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import SplitPoint
from tierlink.errors import ZooError
from tierlink.zoo.cards import write_json

PROFILE_VERSION = 1


@dataclass(frozen=True, slots=True)
class SplitProfile:
    """Every cut of one model file as timed on one machine (``host``)."""

    model: str
    sha256: str
    host: str
    full_ms: float
    input_bytes: int
    points: tuple[SplitPoint, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"version": PROFILE_VERSION, "model": self.model, "sha256": self.sha256,
                "host": self.host, "full_ms": self.full_ms, "input_bytes": self.input_bytes,
                "points": [{"cut": p.cut, "head_ms": p.head_ms, "tail_ms": p.tail_ms,
                            "feature_bytes": p.feature_bytes} for p in self.points]}


def profile_path(card_path: Path) -> Path:
    """Where the split profile of the model whose card is ``card_path`` lives."""
    return card_path.with_name(card_path.stem + ".splits.json")


def load_profile(path: Path, sha256: str | None = None) -> SplitProfile | None:
    """The profile at ``path``; None when absent or made for another file (``sha256``)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ZooError(f"cannot read split profile {path}: {exc}") from exc
    if data.get("version") != PROFILE_VERSION or (sha256 and data.get("sha256") != sha256):
        return None
    points = tuple(SplitPoint(str(p["cut"]), float(p["head_ms"]), float(p["tail_ms"]),
                              int(p["feature_bytes"])) for p in data["points"])
    return SplitProfile(str(data["model"]), str(data["sha256"]), str(data["host"]),
                        float(data["full_ms"]), int(data["input_bytes"]), points)


def save_profile(profile: SplitProfile, path: Path) -> None:
    """Write ``profile`` as JSON atomically."""
    write_json(path, profile.to_dict(), "split profile")


def profile_model(name: str, model_path: Path, sample: np.ndarray, sha256: str, *,
                  rounds: int = 30, clock: Callable[[], float] = time.perf_counter,
                  only: Callable[[str], bool] | None = None) -> SplitProfile:
    """Time the whole model and every (head, tail) pair on ``sample`` (one input, batch 1);
    ``only`` keeps the cuts whose tensor name it accepts (e.g. block boundaries)."""
    from tierlink.split.partition import cut_points, split_model
    from tierlink.zoo.evaluate import ort_session

    x = np.ascontiguousarray(sample[:1], dtype=np.float32)
    full = ort_session(model_path, threads=1)
    cuts = [c for c in cut_points(model_path)
            if c.index > 0 and (only is None or only(c.tensor))]
    with tempfile.TemporaryDirectory(prefix="tierlink-split-") as tmp:
        pairs = []
        for i, cut in enumerate(cuts):
            head, tail = split_model(model_path, cut.tensor, Path(tmp) / f"h{i}.onnx",
                                     Path(tmp) / f"t{i}.onnx")
            pairs.append((cut, ort_session(head, threads=1), ort_session(tail, threads=1)))
        times = _interleaved(full, [(h, t) for _, h, t in pairs], x, rounds, clock)
    points = tuple(SplitPoint(cut.tensor, times[2 * i + 1], times[2 * i + 2],
                              cut.bytes_per_sample) for i, (cut, _, _) in enumerate(pairs))
    return SplitProfile(name, sha256, os.uname().nodename, times[0], int(x.nbytes), points)


def _interleaved(full: Any, pairs: list[tuple[Any, Any]], x: np.ndarray, rounds: int,
                 clock: Callable[[], float]) -> list[float]:
    """Median ms of [full, head0, tail0, head1, tail1, ...] over interleaved rounds."""
    calls = [(full, {full.get_inputs()[0].name: x})]
    for head, tail in pairs:
        head_feed = {head.get_inputs()[0].name: x}
        feature = head.run(None, head_feed)[0]
        calls += [(head, head_feed), (tail, {tail.get_inputs()[0].name: feature})]
    warmup = 3
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds + warmup):
        for j, (session, feed) in enumerate(calls):
            start = clock()
            session.run(None, feed)
            samples[j].append((clock() - start) * 1000.0)
    return [float(np.median(s[warmup:])) for s in samples]
