"""A retraining job, its trainers, its labels and its verdict (see the package doc)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tierlink.core.progress import Reporter
from tierlink.core.registry import Registry
from tierlink.errors import InvalidRequest
from tierlink.models.data import Labelled

__all__ = ["TRAINERS", "Judgement", "TrainJob", "Trainer", "judge", "label_examples"]


@dataclass(frozen=True)
class TrainJob:
    """What a trainer gets: the parent model's file and card, its training data, the hard
    examples with their labels, where to write the new model file, and the task's most
    capable model (``teacher``, a file of the same task; None when there is none to learn
    from), and the trainer's own ``options`` (``tierlink retrain --option KEY=VALUE``: the
    trainer validates them; an unknown one is a ``ConfigError``). A trainer returns the
    file it wrote (``out``, or beside it)."""

    name: str
    parent: Path
    card: Path
    train: Labelled
    hard: Labelled
    out: Path
    teacher: Path | None = None
    reporter: Reporter = field(default_factory=Reporter.quiet)
    options: Mapping[str, str] = field(default_factory=dict)


Trainer = Callable[[TrainJob], Path]
TRAINERS: Registry[Trainer] = Registry("tierlink.trainers", "trainer")


def label_examples(inputs: np.ndarray, labels: np.ndarray,
                   teacher_labels: np.ndarray | None) -> tuple[Labelled, int, int]:
    """The hard examples with a label each: the request's own (``labels`` >= 0) where it
    carried one, else the most capable model's answer (``teacher_labels``); examples with
    neither are left out. Returns them and how many labels were each kind's."""
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    if len(labels) != len(inputs):
        raise InvalidRequest(f"{len(inputs)} hard examples but {len(labels)} labels")
    own = labels >= 0
    chosen = labels.copy()
    if teacher_labels is not None:
        chosen[~own] = np.asarray(teacher_labels).astype(np.int64).reshape(-1)[~own]
    keep = chosen >= 0
    return (Labelled.of(inputs[keep], chosen[keep]), int(own.sum()),
            int((keep & ~own).sum()))


@dataclass(frozen=True, slots=True)
class Judgement:
    """A retrained version against its parent on held-out data: accuracy on all of it and
    on its hard slice (the inputs the parent is less confident of than its cascade
    threshold: those it passes up), in percent; ``better``: publish it."""

    accuracy: float
    parent_accuracy: float
    hard_slice: float
    parent_hard_slice: float
    n: int
    n_hard: int
    better: bool
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"accuracy": self.accuracy, "parent_accuracy": self.parent_accuracy,
                "hard_slice_accuracy": self.hard_slice,
                "parent_hard_slice_accuracy": self.parent_hard_slice, "n": self.n,
                "n_hard": self.n_hard, "better": self.better, "reason": self.reason}


def judge(labels: np.ndarray, parent_probs: np.ndarray, probs: np.ndarray, threshold: float,
          max_drop_pt: float = 0.3) -> Judgement:
    """Better = more accurate on the hard slice and at most ``max_drop_pt`` points less
    accurate on all the held-out data (the bounds of the retraining benchmark)."""
    y = np.asarray(labels).reshape(-1)
    parent_pred, pred = parent_probs.argmax(axis=1), probs.argmax(axis=1)
    hard = parent_probs.max(axis=1) < threshold
    if not hard.any():
        raise InvalidRequest("the held-out data has no input the parent passes up",
                             hint="use more held-out data, or the fleet's threshold")

    def pct(mask: np.ndarray, p: np.ndarray) -> float:
        return round(100.0 * float((p[mask] == y[mask]).mean()), 2)

    every = np.ones_like(hard)
    acc, parent_acc = pct(every, pred), pct(every, parent_pred)
    sl, parent_sl = pct(hard, pred), pct(hard, parent_pred)
    gained, dropped = sl - parent_sl, parent_acc - acc
    better = gained > 0 and dropped <= max_drop_pt
    reason = (f"hard slice {sl:.2f}% vs {parent_sl:.2f}% ({gained:+.2f} pt over "
              f"{int(hard.sum())}), all {acc:.2f}% vs {parent_acc:.2f}% ({-dropped:+.2f} pt, "
              f"at most -{max_drop_pt:g} allowed over {len(y)}): "
              + ("better" if better else "not better: not published"))
    return Judgement(acc, parent_acc, sl, parent_sl, len(y), int(hard.sum()), better, reason)
