"""Measure a multi-exit model's segments into its card's ``multi_exit`` section
(:class:`~tierlink.models.exit_card.ExitNet`), whoever made them: the zoo's trained net or a
user's imported segments.

Per exit (the last output of each segment, fed the chain's real features): accuracy on the
calibration and test data, a temperature fitted on the calibration data with ECE/NLL before
and after, and the cascade curve on calibrated confidence. Per segment: its signature, file,
MACs where known, and latency on one thread (batch 1 and 32). Per boundary: the feature
tensor's shape and bytes. Then the operating point: thresholds chosen on the calibration
data (:func:`~tierlink.models.exit_runner.choose_thresholds`) and what they give on test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np

from tierlink.models.calibration import measure_calibration
from tierlink.models.card import file_sha256
from tierlink.models.data import Labelled
from tierlink.models.evaluate import accuracy, cascade_curve, latency
from tierlink.models.exit_card import Boundary, ExitInfo, ExitNet, OperatingPoint, SegmentInfo
from tierlink.models.exit_runner import (
    MAX_DROP,
    ExitScores,
    choose_thresholds,
    evaluate_scores,
    exit_logits,
)
from tierlink.models.onnx import ort_session
from tierlink.models.tensors import TensorDecl


def measure_net(segments: Sequence[Path], calib: Labelled, test: Labelled,
                sample: np.ndarray, *, runs: int | None = None, threads: int = 1,
                macs: Sequence[int] | None = None, whole: Path | None = None,
                base_variant: str = "", loss_weights: Sequence[float] = ()) -> ExitNet:
    """The ``multi_exit`` section of the chain ``segments`` (in order), measured on
    ``calib`` / ``test`` and timed on ``sample`` (at least one input; ``runs``: exactly that
    many timed calls, else a time budget). ``whole``: the chain as one graph, where there is
    one."""
    sessions = [ort_session(p, threads) for p in segments]
    calib_logits = exit_logits(sessions, calib.input)
    test_logits = exit_logits(sessions, test.input)
    names = [s.get_outputs()[-1].name for s in sessions]
    exits = tuple(_exit_info(name, c, calib.labels, t, test.labels)
                  for name, c, t in zip(names, calib_logits, test_logits, strict=True))
    cost = tuple(macs) if macs is not None else (0,) * len(segments)
    infos, boundaries = _segment_infos(segments, cost, sample, runs)
    temps = tuple(e.temperature for e in exits)
    point = _operating_point(ExitScores.of(calib_logits, calib.labels, temps),
                             ExitScores.of(test_logits, test.labels, temps),
                             tuple(s.latency_ms["batch1_p50"] for s in infos), cost)
    return ExitNet(base_variant=base_variant, loss_weights=tuple(loss_weights),
                   segments=infos, exits=exits, boundaries=boundaries,
                   whole=MappingProxyType({"file": whole.name, "sha256": file_sha256(whole)}
                                          if whole is not None else {}),
                   operating_point=point)


def _exit_info(name: str, calib_logits: np.ndarray, calib_labels: np.ndarray,
               test_logits: np.ndarray, test_labels: np.ndarray) -> ExitInfo:
    calibration = measure_calibration(calib_logits, calib_labels, test_logits, test_labels)
    t = calibration.temperature
    return ExitInfo(name, accuracy(test_logits, test_labels),
                    accuracy(calib_logits, calib_labels), t, calibration,
                    cascade_curve(calib_logits, calib_labels, temperature=t))


def _segment_infos(paths: Sequence[Path], macs: Sequence[int], sample: np.ndarray,
                   runs: int | None) -> tuple[tuple[SegmentInfo, ...], tuple[Boundary, ...]]:
    """Per segment: signature and latency (one thread, batch 1 and 32), fed with the real
    features of ``sample`` at its input; and the boundary tensors."""
    segments, boundaries = [], []
    x = np.ascontiguousarray(sample, dtype=np.float32)
    for k, path in enumerate(paths):
        session = ort_session(path, threads=1)
        name = session.get_inputs()[0].name
        outs = session.run(None, {name: x})
        timing = latency(session, x, runs=runs)
        segments.append(SegmentInfo(
            file=path.name, sha256=file_sha256(path), size_bytes=path.stat().st_size,
            input=TensorDecl(name, "FP32", (-1, *x.shape[1:])),
            outputs=tuple(TensorDecl(o.name, "FP32", (-1, *v.shape[1:]))
                          for o, v in zip(session.get_outputs(), outs, strict=True)),
            macs=int(macs[k]),
            latency_ms=MappingProxyType({k: round(v, 4) for k, v in timing.items()})))
        if k < len(paths) - 1:
            shape = tuple(int(d) for d in outs[0].shape[1:])
            boundaries.append(Boundary(session.get_outputs()[0].name, shape,
                                       4 * math.prod(shape)))
        x = outs[0]
    return tuple(segments), tuple(boundaries)


def _operating_point(calib: ExitScores, test: ExitScores, stage_ms: Sequence[float],
                     macs: Sequence[int]) -> OperatingPoint:
    chosen = choose_thresholds(calib, stage_ms)
    on_test = evaluate_scores(test, chosen.thresholds, stage_ms)
    # The same bookkeeping with MACs as the cost: ``saved`` is then the MACs saved.
    macs_saved = (evaluate_scores(test, chosen.thresholds, [float(m) for m in macs]).saved
                  if any(macs) else 0.0)
    return OperatingPoint(MAX_DROP, chosen, on_test, round(macs_saved, 5))


def chain_order(outputs_of: dict[Path, tuple[str, str]]) -> tuple[Path, ...]:
    """Segments in chain order, from each one's ``(input name, first output name)``: the
    first is the one whose input no segment produces, each next takes the one before's
    first output. ``ValueError`` naming what does not chain."""
    produced = {out: p for p, (_, out) in outputs_of.items()}
    starts = [p for p, (inp, _) in outputs_of.items() if inp not in produced]
    if len(starts) != 1:
        raise ValueError(f"exactly one segment must take an input no other segment gives; "
                         f"found {sorted(p.name for p in starts) or 'none'}")
    by_input = {inp: p for p, (inp, _) in outputs_of.items()}
    order = [starts[0]]
    while (nxt := by_input.get(outputs_of[order[-1]][1])) is not None and nxt not in order:
        order.append(nxt)
    if len(order) != len(outputs_of):
        left = sorted(p.name for p in outputs_of if p not in order)
        raise ValueError(f"segments {left} do not continue the chain from {order[0].name}")
    return tuple(order)
