"""The multi-exit runtime: a multi-exit model served so that each input stops at its first
confident exit, and split at the exit boundaries so a device can exit early *or* hand the
hard inputs on.

:class:`ExitsModel` wraps a built multi-exit model (its card: :mod:`tierlink.models.exit_card`;
e.g. the demo zoo's ``s1 -> exit1 | s2 -> exit2 | s3 -> logits`` with calibrated exits and
an operating point of thresholds chosen on the calibration split), run by
:class:`~tierlink.models.exit_runner.ExitRunner`. It is three things at once:

* a model runtime (``infer``): every sample runs segment by segment and answers at the first
  exit whose calibrated confidence clears its threshold; the answer is the log of that
  exit's calibrated probabilities (so ``softmax`` at temperature 1 gives them back) plus the
  exit index per sample (output ``exit``);
* the head of a split (``head(boundary, x)``): segments up to a boundary, which may already
  answer (an :class:`~tierlink.models.exit_runner.ExitResult`) or return the boundary features to send;
* the tail of a split (``tail(boundary, features)``): the remaining segments, with their exits.

Its split points (:func:`exit_split_points`) carry ``continue_share``, the share of inputs
that pass every exit before the boundary (on the calibration split), so the policy prices
"exit early here, offload the rest" as ``head + continue_share x (send + tail)``: with a weak
uplink the whole model runs here (early exits included); with a strong one the device runs
the cheap first segment and sends only the inputs its first exit could not answer.

:func:`load_exits_model` is the runtime factory of the ``multi-exit`` format
(:mod:`tierlink.models.runtimes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import SplitPoint
from tierlink.errors import ModelError, SplitError
from tierlink.models.card import load_card
from tierlink.models.exit_runner import ExitModel, ExitResult, ExitRunner
from tierlink.models.package import is_package, pack, unpack
from tierlink.models.runtime import ModelInfo, validate_inputs
from tierlink.models.tensors import TensorDecl

PLATFORM = "tierlink_early_exit"


def is_exit_card(path: Path) -> bool:
    """Whether the card at ``path`` describes a multi-exit model (a readable card with a
    ``multi_exit`` section)."""
    try:
        return load_card(Path(path)).multi_exit is not None
    except ModelError:
        return False


def find_exit_card(directory: Path) -> Path:
    """The one multi-exit card (``*.json``) in ``directory``; ``ModelError`` when there is
    none or more than one."""
    cards = sorted(p for p in Path(directory).glob("*.json") if is_exit_card(p))
    if len(cards) != 1:
        found = ", ".join(p.name for p in cards) or "none"
        raise ModelError(f"{directory} must hold exactly one multi-exit card, found {found}",
                         hint="pass the card's path instead of its directory")
    return cards[0]


def exit_split_points(stage_ms: Sequence[float], shares: Sequence[float],
                      boundaries: Sequence[tuple[str, int]]) -> tuple[SplitPoint, ...]:
    """Split points at each boundary k (after segment k): head = segments 0..k, tail = the
    rest, expected over where inputs exit (``shares[j]``: share answered at exit j).
    ``continue_share`` = share of inputs no exit up to k answered: only those are sent."""
    points = []
    for k, (name, nbytes) in enumerate(boundaries):
        reach = [1.0 - sum(shares[:j]) for j in range(len(stage_ms))]  # P(run segment j)
        passed = reach[k + 1] if k + 1 < len(reach) else 0.0
        head = sum(stage_ms[j] * reach[j] for j in range(k + 1))
        tail = sum(stage_ms[j] * reach[j] for j in range(k + 1, len(stage_ms)))
        points.append(SplitPoint(name, head, tail / passed if passed > 0 else 0.0, nbytes,
                                 continue_share=max(0.0, min(1.0, passed))))
    return tuple(points)


@dataclass(frozen=True, slots=True)
class ExitHead:
    """The first half of an early-exit split: per sample, the exit's answer or None, and
    the boundary features (M, ...) of the M samples that got None (None when M = 0)."""

    answers: tuple[Any, ...]
    features: np.ndarray | None

    def merge(self, probs: np.ndarray) -> np.ndarray:
        """All samples' probabilities (N, C): the exits' here, ``probs`` (M, C) from
        upstream for the rest, in order."""
        rows = iter(probs)
        return np.stack([a.probs if a is not None else next(rows) for a in self.answers])

    @property
    def exits(self) -> tuple[int, ...]:
        return tuple(a.exit_index for a in self.answers if a is not None)


class ExitsModel:
    """A multi-exit model served with early exit (see the module docstring). Thread-safe:
    ONNX Runtime sessions may be run concurrently and the runner keeps no per-call state."""

    platform = PLATFORM

    def __init__(self, root: Path, thresholds: Sequence[float] | None = None,
                 threads: int = 1, package: Path | None = None) -> None:
        """``root``: the card, or the directory holding it (and no other multi-exit card);
        ``thresholds``: one per side exit, by default the card's operating point;
        ``package``: the segments as one file (:func:`pack_exits`: a version installed
        from the repository), else they sit beside the card."""
        root = Path(root)
        card_path = find_exit_card(root) if root.is_dir() else root
        card = load_card(card_path)
        packed = package if package is not None and is_package(package) else None
        model = ExitModel(unpack(packed) if packed else card_path.parent, card)
        net, op = model.net, model.net.operating_point
        self.thresholds = tuple(thresholds if thresholds is not None else op.calib.thresholds)
        self.card = card
        self._runner = ExitRunner(model, self.thresholds, threads)
        self._boundaries = {b.name: k for k, b in enumerate(net.boundaries)}
        # The file it was loaded from: its package, else its whole graph or its card.
        self.path = packed or (model.whole_path if net.whole else card_path)
        self.inputs: tuple[TensorDecl, ...] = card.inputs
        self.outputs: tuple[TensorDecl, ...] = card.outputs
        splits = exit_split_points(net.stage_ms(), op.calib.shares,
                                   [(b.name, b.fp32_bytes) for b in net.boundaries])
        self.info = ModelInfo(
            name=card.name, task=card.task, version=card.version,
            accuracy=op.test.accuracy, latency_ms=op.test.mean_ms, temperature=1.0,
            cascade=card.cascade, labels=card.labels, card=card,
            splits=splits, profile_ms=op.test.mean_ms)

    # -- the whole model, exiting early ---------------------------------------------------

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = validate_inputs(self.info.name, self.inputs, inputs)[self.inputs[0].name]
        results = [self._runner.run(x[i:i + 1]) for i in range(x.shape[0])]
        return {"logits": _log_probs([r.probs for r in results]),
                "exit": np.array([r.exit_index for r in results], dtype=np.int64)}

    # -- split at an exit boundary --------------------------------------------------------

    def head(self, cut: str, x: np.ndarray) -> ExitHead:
        """Segments up to boundary ``cut``, sample by sample: the answers of the exits
        there, and the boundary features of the samples none answered (to send on)."""
        k = self._boundary(cut)
        x = validate_inputs(self.info.name, self.inputs, {self.inputs[0].name: x})[
            self.inputs[0].name]
        answers: list[ExitResult | None] = []
        rest = []
        for i in range(x.shape[0]):
            result = self._runner.run_segments(x[i:i + 1], stop=k)
            answers.append(result if isinstance(result, ExitResult) else None)
            if not isinstance(result, ExitResult):
                rest.append(result.features)
        return ExitHead(tuple(answers), np.concatenate(rest) if rest else None)

    def tail(self, cut: str, features: np.ndarray) -> dict[str, np.ndarray]:
        """The segments after boundary ``cut`` (their exits included) on ``features``."""
        k = self._boundary(cut)
        results = []
        for i in range(features.shape[0]):
            result = self._runner.run_segments(features[i:i + 1], start=k + 1)
            if not isinstance(result, ExitResult):
                raise ModelError("early exit ran past the final exit")
            results.append(result)
        return {"logits": _log_probs([r.probs for r in results]),
                "exit": np.array([r.exit_index for r in results], dtype=np.int64)}

    def ready(self, cut: str, part: str = "head") -> bool:
        return True

    def prepare(self, cut: str, part: str = "head") -> None:
        """Nothing to make: the segments are separate files, opened at start."""
        self._boundary(cut)

    def cuts(self) -> frozenset[str]:
        return frozenset(self._boundaries)

    def _boundary(self, cut: str) -> int:
        if cut not in self._boundaries:
            raise SplitError(f"{self.info.name} is split only at its exit boundaries "
                             f"{sorted(self._boundaries)}, not {cut!r}")
        return self._boundaries[cut]


def _log_probs(probs: list[np.ndarray]) -> np.ndarray:
    return np.log(np.clip(np.stack(probs), 1e-30, 1.0)).astype(np.float32)


def load_exits_model(spec: Any) -> ExitsModel:
    """The ``multi-exit`` runtime factory: ``spec`` is a
    :class:`~tierlink.models.runtimes.LoadSpec` (its card and threads; the segments sit
    beside the card), typed ``Any`` so this module need not import the registry."""
    return ExitsModel(spec.card, threads=spec.threads, package=spec.model_file)


def pack_exits(card_path: Path, dest: Path) -> None:
    """The multi-exit model whose card is at ``card_path`` as one file (its segments and
    its whole graph, from beside the card): what a version of it carries."""
    model = ExitModel(Path(card_path).parent, load_card(Path(card_path)))
    pack([(p, p.name) for p in model.files], dest)


__all__ = ["ExitHead", "ExitsModel", "exit_split_points", "find_exit_card", "is_exit_card",
           "load_exits_model", "pack_exits"]
