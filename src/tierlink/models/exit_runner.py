"""Early exit on a multi-exit model (:mod:`tierlink.models.exit_card`): choosing and
evaluating thresholds, and running one input segment by segment until an exit is sure.

An input answers at the first exit whose calibrated confidence (softmax at the exit's
temperature, its max) reaches that exit's threshold; the final exit always answers. A
threshold of 0 always exits there, one of ``NEVER`` (or more) never does.

* :class:`ExitScores`, :func:`evaluate_scores`, :func:`choose_thresholds`: pure numpy, on
  every exit's logits computed once (:func:`exit_logits`, :func:`evaluate_exits`);
* :class:`ExitRunner`: one input through the segments (ONNX Runtime), stopping at the first
  sure exit, or stopping at a boundary and handing its features on (:class:`Handoff`).

numpy + ONNX Runtime only.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tierlink.errors import ConfigError, ModelError, TensorError
from tierlink.models.card import ModelCard
from tierlink.models.evaluate import CASCADE_THRESHOLDS, softmax
from tierlink.models.exit_card import ExitEvaluation, ExitNet

if TYPE_CHECKING:
    from tierlink.models.data import Labelled

NEVER = 1.01  # a threshold no calibrated confidence reaches: that exit never answers
EXIT_THRESHOLDS: tuple[float, ...] = (*CASCADE_THRESHOLDS, 0.995, 0.998, 0.999, NEVER)
MAX_DROP = 0.005  # the operating point may lose this much accuracy vs the final exit

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class ExitModel:
    """A multi-exit model on disk: its directory (the segments) and its card."""

    root: Path
    card: ModelCard

    @property
    def net(self) -> ExitNet:
        """The card's ``multi_exit`` section."""
        if self.card.multi_exit is None:
            raise ModelError(f"{self.card.name} is not a multi-exit model",
                             hint="its card has no multi_exit section")
        return self.card.multi_exit

    @property
    def segment_paths(self) -> tuple[Path, ...]:
        return tuple(self.root / s.file for s in self.net.segments)

    @property
    def whole_path(self) -> Path:
        """The chain as one graph (the zoo exports one; an imported model may have none)."""
        if not self.net.whole:
            raise ModelError(f"{self.card.name} has no single-graph export")
        return self.root / self.net.whole["file"]

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file of the model: its segments and, where there is one, its whole graph."""
        return (*self.segment_paths, *((self.whole_path,) if self.net.whole else ()))

    @property
    def card_path(self) -> Path:
        """``card.json`` (the framework's layout), else ``<card.name>.json`` beside it."""
        in_layout = self.root / "card.json"
        return in_layout if in_layout.is_file() else self.root / f"{self.card.name}.json"


# --- evaluation (pure numpy) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExitScores:
    """Every exit's calibrated confidence (E, N) and top-1 correctness (E, N) on a split."""

    confidence: np.ndarray
    correct: np.ndarray

    @classmethod
    def of(cls, logits: Sequence[np.ndarray], labels: np.ndarray,
           temperatures: Sequence[float]) -> ExitScores:
        """From each exit's logits (N, C) and its temperature."""
        probs = [softmax(z, t) for z, t in zip(logits, temperatures, strict=True)]
        return cls(np.stack([p.max(axis=1) for p in probs]),
                   np.stack([p.argmax(axis=1) == labels for p in probs]))


def evaluate_scores(scores: ExitScores, thresholds: Sequence[float],
                    stage_ms: Sequence[float]) -> ExitEvaluation:
    """Each input answers at the first exit whose confidence >= its threshold (the last
    exit always answers); accuracy, shares per exit and mean ms of the segments run."""
    n_exits, n = scores.confidence.shape
    _check_thresholds(thresholds, n_exits)
    taken = np.full(n, n_exits - 1)  # (N,) index of the exit that answers
    open_ = np.ones(n, dtype=bool)
    for k, t in enumerate(thresholds):
        fire = open_ & (scores.confidence[k] >= t)
        taken[fire] = k
        open_ &= ~fire
    cost = np.cumsum(np.asarray(stage_ms, dtype=np.float64))  # (E,) ms to reach exit k
    shares = np.bincount(taken, minlength=n_exits) / n
    return ExitEvaluation(
        thresholds=tuple(float(t) for t in thresholds),
        accuracy=float(scores.correct[taken, np.arange(n)].mean()),
        shares=tuple(round(float(s), 6) for s in shares),
        mean_ms=float(cost[taken].mean()), full_ms=float(cost[-1]))


def choose_thresholds(scores: ExitScores, stage_ms: Sequence[float], *,
                      max_drop: float = MAX_DROP,
                      grid: Sequence[float] = EXIT_THRESHOLDS) -> ExitEvaluation:
    """The cheapest thresholds on ``grid`` (least mean ms, then best accuracy) whose accuracy
    stays within ``max_drop`` of the final exit's alone. Always feasible: thresholds of
    ``NEVER`` give the final exit's accuracy."""
    floor = float(scores.correct[-1].mean()) - max_drop - 1e-12
    best: ExitEvaluation | None = None
    for thresholds in itertools.product(grid, repeat=scores.confidence.shape[0] - 1):
        ev = evaluate_scores(scores, thresholds, stage_ms)
        if ev.accuracy >= floor and (best is None or (ev.mean_ms, -ev.accuracy)
                                     < (best.mean_ms, -best.accuracy)):
            best = ev
    if best is None:  # only when the grid lacks a never-exit threshold
        raise ConfigError("no thresholds on the grid meet the accuracy floor",
                          hint=f"include {NEVER} (never exit) in the grid")
    return best


def _check_thresholds(thresholds: Sequence[float], n_exits: int) -> None:
    if len(thresholds) != n_exits - 1:
        raise ConfigError(f"early exit needs {n_exits - 1} thresholds (one per side exit), "
                          f"got {len(thresholds)}", hint="e.g. thresholds=(0.95, 0.9)")
    if not all(isinstance(t, (int, float)) and math.isfinite(t) for t in thresholds):
        raise ConfigError(f"early-exit thresholds must be finite numbers, got {thresholds}",
                          hint=f"0 = always exit there, >= {NEVER} = never")


def exit_logits(sessions: Sequence[Any], images: np.ndarray, *,
                batch_size: int = 500) -> tuple[np.ndarray, ...]:
    """Every exit's logits (N, C) on ``images`` (the first segment's input, N first),
    running the segment sessions in a chain (each segment's first output feeds the next).
    No images: each exit's logits are (0, 10)."""
    images = np.ascontiguousarray(images, dtype=np.float32)
    chunks: list[list[np.ndarray]] = [[] for _ in sessions]
    for i in range(0, len(images), batch_size):
        x = images[i:i + batch_size]
        for k, session in enumerate(sessions):
            outs = session.run(None, {session.get_inputs()[0].name: x})
            chunks[k].append(outs[-1])
            x = outs[0]
    return tuple(np.concatenate(c) if c else np.zeros((0, 10), np.float32) for c in chunks)


def evaluate_exits(model: ExitModel, thresholds: Sequence[float], split: Labelled, *,
                   threads: int = 2) -> ExitEvaluation:
    """Early exit at ``thresholds`` on ``split`` (run with ONNX Runtime), costed with the
    card's batch-1 segment latencies. To compare many thresholds, build :class:`ExitScores`
    once and call :func:`evaluate_scores`."""
    from tierlink.models.onnx import ort_session

    sessions = [ort_session(p, threads) for p in model.segment_paths]
    scores = ExitScores.of(exit_logits(sessions, split.input), split.labels,
                           model.net.temperatures)
    return evaluate_scores(scores, thresholds, model.net.stage_ms())


# --- the runtime ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExitResult:
    """An answer: the exit that gave it (0-based index into the card's exits), its
    calibrated probabilities (C,), their max, and the wall time of each segment run (ms)."""

    exit_index: int
    probs: np.ndarray
    confidence: float
    ms_per_stage: tuple[float, ...]

    @property
    def label(self) -> int:
        return int(self.probs.argmax())


@dataclass(frozen=True, slots=True)
class Handoff:
    """No exit cleared its threshold before the segments this node runs ended: the boundary
    tensor (1, C, H, W) to send on, with the time each segment took (ms)."""

    boundary: str
    features: np.ndarray
    ms_per_stage: tuple[float, ...]


@dataclass
class ExitRunner:
    """Runs one input through the segments and stops at the first exit whose calibrated
    confidence >= its threshold (``thresholds[k]`` for exit k; the final exit always answers;
    0 = always stop there, >= ``NEVER`` = never). Not thread-safe: one per worker."""

    model: ExitModel
    thresholds: tuple[float, ...]
    threads: int = 1
    clock: Clock = time.perf_counter
    _sessions: list[Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from tierlink.models.onnx import ort_session

        _check_thresholds(self.thresholds, len(self.model.net.exits))
        self._sessions = [ort_session(p, self.threads) for p in self.model.segment_paths]

    def run(self, x: np.ndarray) -> ExitResult:
        """Answer one input (the first segment's, batch of one: (1, 1, 28, 28) float32 in
        [0, 1] for the zoo's Fashion-MNIST net)."""
        result = self.run_segments(x)
        if not isinstance(result, ExitResult):  # the last segment always answers
            raise ModelError("early exit ran past the final exit")
        return result

    def run_segments(self, x: np.ndarray, *, start: int = 0,
                     stop: int | None = None) -> ExitResult | Handoff:
        """Run segments ``start``..``stop`` (inclusive; default the last) on ``x``, the input
        of segment ``start`` with a batch of one: an answer as soon as an exit clears its
        threshold, else the features at boundary ``stop`` (a split: the rest runs upstream)."""
        last = len(self._sessions) - 1
        stop = last if stop is None else stop
        if not 0 <= start <= stop <= last:
            raise ConfigError(f"segments {start}..{stop} are outside 0..{last}")
        x = self._checked(x, start)
        spent: list[float] = []
        for k in range(start, stop + 1):
            began = self.clock()
            outs = self._sessions[k].run(None, {self.model.net.segments[k].input.name: x})
            spent.append((self.clock() - began) * 1000.0)
            answer = self._answer(k, outs[-1], tuple(spent))
            if answer is not None:
                return answer
            x = outs[0]
        return Handoff(self.model.net.boundaries[stop].name, x, tuple(spent))

    def _answer(self, k: int, logits: np.ndarray, spent: tuple[float, ...]) -> ExitResult | None:
        probs = softmax(logits, self.model.net.exits[k].temperature)[0]  # (C,)
        confidence = float(probs.max())
        final = k == len(self._sessions) - 1
        if final or confidence >= self.thresholds[k]:
            return ExitResult(k, probs, confidence, spent)
        return None

    def _checked(self, x: np.ndarray, start: int) -> np.ndarray:
        segment_input = self.model.net.segments[start].input
        want = (1, *segment_input.shape[1:])
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape != want:
            raise TensorError(f"segment {start} takes one {segment_input.name} tensor of "
                              f"shape {want}, got {x.shape}")
        return x
