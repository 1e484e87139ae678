"""Per-node split profiles: how long every head and tail segment of a model takes here.

``profile_model`` cuts the model at each single-tensor cut point
(:func:`tierlink.split.partition.cut_points`), and times head and tail on this machine with
one ONNX Runtime thread, batch 1, interleaving the segments round by round so drift hits
them alike. The result is saved beside the model card as ``<model>.splits.json`` and read
by the node, which reports it with its heartbeat (``ModelView.splits``) so any policy can
price a split plan: the device prices heads with its own profile and tails with the
upstream's.

Each cut also runs the feature codecs (:data:`PROFILE_CODECS`) on the features the sample
really produces there: the payload's size and the encode / decode time per (cut, codec),
because features compress very differently along a network (int8+zstd shrinks MobileNetV2's
early, sparse ReLU maps 8x and its late ones 3x). Version 1 profiles (no codecs) still load.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import CodecPoint, SplitPoint
from tierlink.models.split_profile import SplitProfile

PROFILE_CODECS: tuple[str, ...] = ("fp32", "fp16", "int8", "int8+zstd")


def profile_model(name: str, model_path: Path, sample: np.ndarray, sha256: str, *,
                  rounds: int = 30, clock: Callable[[], float] = time.perf_counter,
                  only: Callable[[str], bool] | None = None,
                  codecs: tuple[str, ...] = PROFILE_CODECS) -> SplitProfile:
    """Time the whole model and every (head, tail) pair on ``sample`` (one input, batch 1),
    and each of ``codecs`` on every cut's features; ``only`` keeps the cuts whose tensor
    name it accepts (e.g. block boundaries)."""
    from tierlink.models.onnx import ort_session
    from tierlink.split.cache import cached_split
    from tierlink.split.partition import cut_points

    x = np.ascontiguousarray(sample[:1], dtype=np.float32 if sample.dtype.kind == "f"
                             else sample.dtype)  # token ids stay integers
    full = ort_session(model_path, threads=1)
    cuts = [c for c in cut_points(model_path)
            if c.index > 0 and (only is None or only(c.tensor))]
    with tempfile.TemporaryDirectory(prefix="tierlink-split-") as tmp:
        pairs = []
        for cut in cuts:  # kept beside the model: nodes that open these cuts find them made
            head, tail = cached_split(model_path, cut.tensor, fallback_dir=Path(tmp))
            pairs.append((cut, ort_session(head, threads=1), ort_session(tail, threads=1)))
        times = _interleaved(full, [(h, t) for _, h, t in pairs], x, rounds, clock)
        measured = [codec_points(h.run(None, {h.get_inputs()[0].name: x})[0], codecs,
                                 max(3, rounds // 3), clock) for _, h, _ in pairs]
    points = tuple(SplitPoint(cut.tensor, times[2 * i + 1], times[2 * i + 2],
                              cut.bytes_per_sample, measured[i])
                   for i, (cut, _, _) in enumerate(pairs))
    return SplitProfile(name, sha256, os.uname().nodename, times[0], int(x.nbytes), points)


def codec_points(features: np.ndarray, codecs: tuple[str, ...], rounds: int,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[CodecPoint, ...]:
    """Each codec on ``features`` (batch 1): payload bytes, median encode and decode ms."""
    from tierlink.split.codecs import decode_any, get_codec

    out = []
    for spec in codecs:
        codec = get_codec(spec)
        enc, dec, payload = [], [], b""
        for _ in range(rounds):
            start = clock()
            payload = codec.encode(features)
            mid = clock()
            decode_any(payload)
            enc.append((mid - start) * 1000.0)
            dec.append((clock() - mid) * 1000.0)
        out.append(CodecPoint(spec, len(payload), float(np.median(enc)), float(np.median(dec))))
    return tuple(out)


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
