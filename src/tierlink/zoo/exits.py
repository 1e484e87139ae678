"""Early exit: a multi-exit Fashion-MNIST net, exported as segments a node can stop after.

The net is the zoo's ``large`` architecture (``SPECS["large"]``: stages (32,), (64, 64),
(128, 128), flatten head) with BranchyNet-style side classifiers after stage 1 and stage 2,
trained jointly (weighted sum of the three cross-entropies) with the zoo's SGD / one-cycle
recipe. It is exported as three ONNX segments whose boundaries are also split points::

    fmnist-exits-s1.onnx  input (N, 1, 28, 28) -> features1 (N, 32, 14, 14), exit1 (N, 10)
    fmnist-exits-s2.onnx  features1            -> features2 (N, 64, 7, 7),   exit2 (N, 10)
    fmnist-exits-s3.onnx  features2            -> logits (N, 10)
    fmnist-exits.onnx     input -> exit1, exit2, logits (the whole chain, for checking)

with a card (``fmnist-exits.json``, an :class:`ExitCard`, not a ``ModelCard``): per exit its
accuracy, a temperature fitted on the calibration split, ECE before/after and its cascade
curve; per segment its latency and MACs; per boundary the feature shape and bytes; and an
operating point (thresholds within 0.5 point of the final exit on the calibration split).
Everything lives in ``<zoo dir>/fmnist-exits/``: a subdirectory, because the zoo cache reads
every ``fmnist-*.json`` beside its models as a ``ModelCard``.

This module is torch-free: the layout constants, the card, loading and staleness, threshold
evaluation and the runtime (:class:`ExitRunner`) are numpy + ONNX Runtime. The torch builder
(the net, training, export, measuring the card) is :mod:`tierlink.zoo.exits_build`, imported
by :func:`ensure_exits` only when a build is needed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from tierlink.core.types import CascadePoint
from tierlink.errors import ConfigError, TensorError, ZooError
from tierlink.models.card import (
    Calibration,
    TrainingInfo,
    calibration_from_dict,
    cascade_from_dicts,
    file_sha256,
    write_json,
)
from tierlink.models.evaluate import CASCADE_THRESHOLDS, softmax
from tierlink.models.tensors import TensorDecl
from tierlink.zoo.profiles import FMNIST_SPLITS_ID, SPECS, BuildProfile, TrainRecipe, get_profile

if TYPE_CHECKING:
    from tierlink.models.data import Labelled

EXITS_NAME = "fmnist-exits"
EXITS_VERSION = "1"
TASK = "fmnist"
BASE_VARIANT = "large"
# Joint loss weights of exit1, exit2 and the final head (BranchyNet weighs the early exits
# lower so they do not pull the shared trunk away from the final classifier).
LOSS_WEIGHTS: tuple[float, ...] = (0.3, 0.3, 1.0)
# Side branches (conv width, 2x2 max-pool first): [pool ->] 3x3 conv + BN + ReLU -> 2x2
# max-pool -> flatten -> linear, the conv at 7x7. Exit 1 costs ~0.9M MACs and exit 2 ~1.8M,
# against ~10.8M for the stage after each.
BRANCHES: tuple[tuple[int, bool], ...] = ((64, True), (64, False))
SEGMENT_INPUTS = ("input", "features1", "features2")
SEGMENT_OUTPUTS: tuple[tuple[str, ...], ...] = (
    ("features1", "exit1"), ("features2", "exit2"), ("logits",))
EXIT_NAMES = ("exit1", "exit2", "logits")
NEVER = 1.01  # a threshold no calibrated confidence reaches: that exit never answers
EXIT_THRESHOLDS: tuple[float, ...] = (*CASCADE_THRESHOLDS, 0.995, 0.998, 0.999, NEVER)
MAX_DROP = 0.005  # the operating point may lose this much accuracy vs the final exit
# Per profile, a recipe of its own where it differs from the profile's ``large`` one. Full:
# 4 epochs instead of the zoo's 7, because the reference build ran on two cores shared with
# other builds (13 min per epoch at the worst); 7 would match ``fmnist-large`` exactly.
RECIPES: Mapping[str, TrainRecipe] = MappingProxyType({
    "full": TrainRecipe(epochs=4, flips=True)})

Clock = Callable[[], float]


# --- the card -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Boundary:
    """A split point between two segments: the feature tensor per sample (no batch dim)."""

    name: str
    shape: tuple[int, ...]
    fp32_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "fp32_bytes": self.fp32_bytes}


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One exported segment: its file, signature, MACs per sample and latency (ONNX Runtime,
    one thread: ``batch1_p50``, ``batch1_p95``, ``batch32_per_sample`` in ms)."""

    file: str
    sha256: str
    size_bytes: int
    input: TensorDecl
    outputs: tuple[TensorDecl, ...]
    macs: int
    latency_ms: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "size_bytes": self.size_bytes,
                "input": self.input.to_dict(), "outputs": [o.to_dict() for o in self.outputs],
                "macs": self.macs, "latency_ms": dict(self.latency_ms)}


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """One exit (the last output of the segment of the same index): accuracy on the
    calibration and test splits, its temperature and calibration measures, and its cascade
    curve on calibrated confidence (calibration split)."""

    name: str
    test_accuracy: float
    calib_accuracy: float
    temperature: float
    calibration: Calibration
    cascade: tuple[CascadePoint, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "test_accuracy": self.test_accuracy,
                "calib_accuracy": self.calib_accuracy, "temperature": self.temperature,
                "calibration": self.calibration.to_dict(),
                "cascade": [{"threshold": p.threshold, "answered_share": p.answered_share,
                             "answered_accuracy": p.answered_accuracy} for p in self.cascade]}


@dataclass(frozen=True, slots=True)
class ExitEvaluation:
    """Early exit at ``thresholds`` on one split: accuracy, the share of inputs answered at
    each exit, and the mean compute per input (sum of the batch-1 latencies of the segments
    it ran) against ``full_ms``, always running every segment."""

    thresholds: tuple[float, ...]
    accuracy: float
    shares: tuple[float, ...]
    mean_ms: float
    full_ms: float

    @property
    def saved(self) -> float:
        """Share of the always-run-everything compute saved (0..1)."""
        return 1.0 - self.mean_ms / self.full_ms if self.full_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"thresholds": list(self.thresholds), "accuracy": self.accuracy,
                "shares": list(self.shares), "mean_ms": self.mean_ms,
                "full_ms": self.full_ms, "saved": round(self.saved, 5)}


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Thresholds chosen on the calibration split (cheapest within ``max_drop`` of the final
    exit's accuracy), and what they give on calibration and on test."""

    max_drop: float
    calib: ExitEvaluation
    test: ExitEvaluation
    macs_saved: float  # on test, share of the always-run-everything MACs saved

    def to_dict(self) -> dict[str, Any]:
        return {"max_drop": self.max_drop, "calib": self.calib.to_dict(),
                "test": self.test.to_dict(), "macs_saved": self.macs_saved}


@dataclass(frozen=True, slots=True)
class ExitCard:
    """Everything known about the built multi-exit model (see the module docstring).

    ``segments[i]`` produces ``exits[i]``; ``boundaries[i]`` is the feature tensor between
    segment i and i + 1. ``whole``: the single-graph export (file name and sha256).
    """

    name: str
    task: str
    version: str
    base_variant: str
    params: int
    labels: tuple[str, ...]
    loss_weights: tuple[float, ...]
    segments: tuple[SegmentInfo, ...]
    exits: tuple[ExitInfo, ...]
    boundaries: tuple[Boundary, ...]
    whole: Mapping[str, str]
    operating_point: OperatingPoint
    training: TrainingInfo

    @property
    def temperatures(self) -> tuple[float, ...]:
        return tuple(e.temperature for e in self.exits)

    def stage_ms(self, key: str = "batch1_p50") -> tuple[float, ...]:
        """Latency of each segment (its exit included), ms."""
        return tuple(s.latency_ms[key] for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "task": self.task, "version": self.version,
                "base_variant": self.base_variant, "params": self.params,
                "labels": list(self.labels), "loss_weights": list(self.loss_weights),
                "segments": [s.to_dict() for s in self.segments],
                "exits": [e.to_dict() for e in self.exits],
                "boundaries": [b.to_dict() for b in self.boundaries],
                "whole": dict(self.whole), "operating_point": self.operating_point.to_dict(),
                "training": self.training.to_dict()}


def exit_card_from_dict(data: Mapping[str, Any], source: str = "exit card") -> ExitCard:
    """Parse the JSON form of an :class:`ExitCard`; ``ZooError`` naming what is wrong."""
    if not isinstance(data, Mapping):
        raise ZooError(f"{source} is not a JSON object")
    try:
        return _card(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ZooError(f"{source} is missing or has a malformed field: {exc!r}",
                       hint="rebuild it with ensure_exits(force=True)") from exc


def _card(d: Mapping[str, Any]) -> ExitCard:
    op = d["operating_point"]
    return ExitCard(
        name=str(d["name"]), task=str(d["task"]), version=str(d["version"]),
        base_variant=str(d["base_variant"]), params=int(d["params"]),
        labels=tuple(str(x) for x in d["labels"]),
        loss_weights=tuple(float(w) for w in d["loss_weights"]),
        segments=tuple(_segment(s) for s in d["segments"]),
        exits=tuple(_exit(e) for e in d["exits"]),
        boundaries=tuple(Boundary(str(b["name"]), tuple(int(x) for x in b["shape"]),
                                  int(b["fp32_bytes"])) for b in d["boundaries"]),
        whole=MappingProxyType({k: str(v) for k, v in d["whole"].items()}),
        operating_point=OperatingPoint(float(op["max_drop"]), _evaluation(op["calib"]),
                                       _evaluation(op["test"]), float(op["macs_saved"])),
        training=TrainingInfo(**d["training"]))


def _tensor(d: Mapping[str, Any]) -> TensorDecl:
    return TensorDecl(str(d["name"]), str(d["datatype"]), tuple(int(x) for x in d["shape"]))


def _segment(d: Mapping[str, Any]) -> SegmentInfo:
    return SegmentInfo(
        file=str(d["file"]), sha256=str(d["sha256"]), size_bytes=int(d["size_bytes"]),
        input=_tensor(d["input"]), outputs=tuple(_tensor(o) for o in d["outputs"]),
        macs=int(d["macs"]),
        latency_ms=MappingProxyType({k: float(v) for k, v in d["latency_ms"].items()}))


def _exit(d: Mapping[str, Any]) -> ExitInfo:
    return ExitInfo(str(d["name"]), float(d["test_accuracy"]), float(d["calib_accuracy"]),
                    float(d["temperature"]), calibration_from_dict(d["calibration"]),
                    cascade_from_dicts(d["cascade"]))


def _evaluation(d: Mapping[str, Any]) -> ExitEvaluation:
    return ExitEvaluation(tuple(float(t) for t in d["thresholds"]), float(d["accuracy"]),
                          tuple(float(s) for s in d["shares"]), float(d["mean_ms"]),
                          float(d["full_ms"]))


def save_exit_card(card: ExitCard, path: Path) -> None:
    """Write ``card`` as JSON atomically."""
    write_json(path, card.to_dict(), "exit card")


def load_exit_card(path: Path) -> ExitCard:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ZooError(f"cannot read exit card {path}: {exc}") from exc
    return exit_card_from_dict(data, source=f"exit card {path}")


# --- the model on disk ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExitModel:
    """A valid built multi-exit model: its directory and card."""

    root: Path
    card: ExitCard

    @property
    def segment_paths(self) -> tuple[Path, ...]:
        return tuple(self.root / s.file for s in self.card.segments)

    @property
    def whole_path(self) -> Path:
        return self.root / self.card.whole["file"]

    @property
    def card_path(self) -> Path:
        return self.root / f"{EXITS_NAME}.json"


def exits_dir(profile: str = "full", root: Path | None = None) -> Path:
    """Where the multi-exit model of ``profile`` lives: ``<root or zoo_dir>/fmnist-exits``."""
    from tierlink.zoo.cache import zoo_dir

    return (zoo_dir(profile) if root is None else Path(root)) / EXITS_NAME


def exits_fingerprint(profile: BuildProfile) -> str:
    """Hash of everything that determines the weights and the measured card: a card with
    another fingerprint is rebuilt. Bump ``EXITS_VERSION`` for code changes."""
    parts = (EXITS_VERSION, SPECS[BASE_VARIANT], BRANCHES, LOSS_WEIGHTS,
             exits_recipe(profile), profile.train_samples, profile.eval_samples, profile.seed,
             FMNIST_SPLITS_ID)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def exits_recipe(profile: BuildProfile) -> TrainRecipe:
    """The training recipe of the multi-exit net in ``profile`` (see ``RECIPES``)."""
    return RECIPES.get(profile.name) or profile.recipe(TASK, BASE_VARIANT)


def load_exits(profile: str = "full", root: Path | None = None) -> ExitModel:
    """The multi-exit model already built for ``profile``; ``ZooError`` saying what is
    missing or stale."""
    build_profile = get_profile(profile)
    directory = exits_dir(profile, root)
    card_path = directory / f"{EXITS_NAME}.json"
    if not card_path.is_file():
        raise ZooError(f"{EXITS_NAME} is not built in {directory}",
                       hint="build it with tierlink.zoo.exits.ensure_exits()")
    card = load_exit_card(card_path)
    problem = _stale_reason(card, directory, build_profile)
    if problem:
        raise ZooError(f"{EXITS_NAME} in {directory} is stale: {problem}")
    return ExitModel(directory, card)


def _stale_reason(card: ExitCard, directory: Path, profile: BuildProfile) -> str | None:
    if card.version != EXITS_VERSION or card.training.profile != profile.name:
        return f"it is version {card.version} of profile {card.training.profile!r}"
    if card.training.recipe != exits_fingerprint(profile):
        return "it was built with another architecture or recipe"
    files = [(s.file, s.sha256) for s in card.segments] + [
        (card.whole["file"], card.whole["sha256"])]
    for name, sha in files:
        path = directory / name
        if not path.is_file() or file_sha256(path) != sha:
            return f"{name} is missing or does not match the sha256 in its card"
    return None


def ensure_exits(profile: str = "full", root: Path | None = None, progress: bool = False, *,
                 force: bool = False, clock: Clock = time.perf_counter) -> ExitModel:
    """The multi-exit model of ``profile``, built first when missing or stale (``full``:
    ~15 minutes of CPU; ``test``: seconds). Holds ``build_lock(root, "fmnist-exits")`` while
    building, so processes that start together build once."""
    from tierlink.zoo.cache import build_lock, zoo_dir

    base = zoo_dir(profile) if root is None else Path(root)
    if not force:
        try:
            return load_exits(profile, base)
        except ZooError:
            pass
    base.mkdir(parents=True, exist_ok=True)
    with build_lock(base, EXITS_NAME):
        if not force:
            try:  # another process may have built it while this one waited for the lock
                return load_exits(profile, base)
            except ZooError:
                pass
        from tierlink.zoo.exits_build import build_exits  # torch: only when building

        with _reporter(progress) as reporter:
            build_exits(get_profile(profile), exits_dir(profile, base), reporter, clock=clock)
    return load_exits(profile, base)


def _reporter(progress: bool) -> Any:
    from tierlink.zoo.progress import NullReporter, RichReporter

    return RichReporter() if progress else nullcontext(NullReporter())


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
    """Every exit's logits (N, 10) on ``images`` (N, 1, 28, 28), running the segment
    sessions in a chain (each segment's first output feeds the next)."""
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
                           model.card.temperatures)
    return evaluate_scores(scores, thresholds, model.card.stage_ms())


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

        _check_thresholds(self.thresholds, len(self.model.card.exits))
        self._sessions = [ort_session(p, self.threads) for p in self.model.segment_paths]

    def run(self, x: np.ndarray) -> ExitResult:
        """Answer one image (1, 1, 28, 28) float32 in [0, 1]."""
        result = self.run_segments(x)
        if not isinstance(result, ExitResult):  # the last segment always answers
            raise ZooError("early exit ran past the final exit")
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
            outs = self._sessions[k].run(None, {SEGMENT_INPUTS[k]: x})
            spent.append((self.clock() - began) * 1000.0)
            answer = self._answer(k, outs[-1], tuple(spent))
            if answer is not None:
                return answer
            x = outs[0]
        return Handoff(self.model.card.boundaries[stop].name, x, tuple(spent))

    def _answer(self, k: int, logits: np.ndarray, spent: tuple[float, ...]) -> ExitResult | None:
        probs = softmax(logits, self.model.card.exits[k].temperature)[0]  # (C,)
        confidence = float(probs.max())
        final = k == len(self._sessions) - 1
        if final or confidence >= self.thresholds[k]:
            return ExitResult(k, probs, confidence, spent)
        return None

    def _checked(self, x: np.ndarray, start: int) -> np.ndarray:
        want = (1, *self.model.card.segments[start].input.shape[1:])
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape != want:
            raise TensorError(f"segment {start} takes one {SEGMENT_INPUTS[start]} tensor of "
                              f"shape {want}, got {x.shape}")
        return x
