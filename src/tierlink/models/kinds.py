"""Output kinds: how a model's raw outputs become an answer, how sure it is, and how good.

Each kind reads the output tensors its task names by role (:attr:`TaskSpec.outputs`; a
missing role defaults to the model's first output where that makes sense) and gives:

* :meth:`OutputKind.answer` — the tensors a caller gets back and a per-sample confidence in
  [0, 1] (``None``: this kind, as declared, has no confidence — such a task is placed by SLA,
  privacy, load and cost, and never cascaded);
* :meth:`OutputKind.score` — the task metric on labelled data (higher is better; the card's
  ``test_accuracy`` for policies), and :meth:`OutputKind.correct` — per sample, whether the
  answer counts as right (what cascade tuning needs; ``None`` where it has no meaning);
* :attr:`OutputKind.temperature_fit` — whether a temperature is fitted on calibration data
  (:meth:`OutputKind.logits` is what it divides, :meth:`OutputKind.nll` what it minimises).

Pure numpy. Kinds live in a registry (``tasks/registry.py``); a user's package adds its own
through the ``tierlink.output_kinds`` entry point group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tierlink.errors import ConfigError, TensorError
from tierlink.models.task import TaskSpec

Outputs = Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Answer:
    """What a model answered for a batch: the caller's tensors and how sure it is."""

    outputs: dict[str, np.ndarray]
    confidence: np.ndarray | None  # (B,) in [0, 1]; None: no confidence for this kind


class OutputKind(Protocol):
    name: str
    metric: str  # what ``score`` measures, e.g. "accuracy"
    temperature_fit: bool  # a temperature is fitted on the calibration data

    @property
    def answers(self) -> tuple[tuple[str, str, int, str], ...]:
        """The answer's tensors: (name, OIP datatype, rank (-1: the rank of the model's
        output playing ``role``), role ("" when always answered; else only when the task
        has it)). Read-only: a class attribute of each kind."""
        ...

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        """The output roles this kind reads (the first is the default for a 1-output model)."""
        ...

    def answer(self, raw: Outputs, task: TaskSpec, temperature: float = 1.0) -> Answer: ...

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None: ...

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None: ...

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        """What a temperature divides (None where no temperature applies)."""
        ...

    def nll(self, logits: np.ndarray, y: np.ndarray, task: TaskSpec,
            temperature: float) -> float:
        """The mean negative log-likelihood of the labels ``y`` under ``logits / T``: what
        the temperature minimises on the calibration data. Only called on a kind with
        ``temperature_fit``; a kind without one need not define it."""
        ...


def role(raw: Outputs, task: TaskSpec, name: str, required: bool = True) -> np.ndarray | None:
    """The tensor playing ``name``: the task's declared output, else the only output."""
    declared = task.output(name)
    if declared is not None:
        if declared not in raw:
            raise TensorError(f"task {task.name!r} reads output {declared!r} as {name}, but "
                              f"the model gives {sorted(raw)}")
        return np.asarray(raw[declared])
    if not required:
        return None
    if len(raw) == 1:
        return np.asarray(next(iter(raw.values())))
    raise TensorError(f"task {task.name!r} does not say which of the outputs {sorted(raw)} "
                      f"is its {name!r}", hint=f"declare outputs: {{{name}: OUTPUT_NAME}}")


def softmax(z: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = z.astype(np.float64) / max(temperature, 1e-6)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def sigmoid(z: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-z.astype(np.float64) / max(temperature, 1e-6)))
            ).astype(np.float32)


class Classification:
    """Scores (B, C): logits, or probabilities with ``options.probabilities: true``.
    Answer: ``probabilities`` (calibrated) and ``label``; confidence = top-1 probability."""

    name = "classification"
    metric = "accuracy"
    temperature_fit = True
    answers = (("probabilities", "FP32", 2, ""), ("label", "INT64", 1, ""))

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        return ("scores",)

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        scores = _matrix(role(raw, task, "scores"), task, "scores")
        if task.option("probabilities", False):
            return np.log(np.clip(scores.astype(np.float64), 1e-12, None))
        return scores

    def answer(self, raw: Outputs, task: TaskSpec, temperature: float = 1.0) -> Answer:
        probs = softmax(self.logits(raw, task), temperature)  # type: ignore[arg-type]
        return Answer({"probabilities": probs, "label": probs.argmax(axis=1).astype(np.int64)},
                      probs.max(axis=1))

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None:
        return answer.outputs["label"] == class_ids(y, answer.outputs["probabilities"].shape)

    def nll(self, logits: np.ndarray, y: np.ndarray, task: TaskSpec,
            temperature: float) -> float:
        labels = class_ids(y, logits.shape)
        p = softmax(logits, temperature).astype(np.float64)[np.arange(len(labels)), labels]
        return float(-np.log(np.clip(p, 1e-12, None)).mean())

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None:
        return float(self.correct(answer, y, task).mean())  # type: ignore[union-attr]


class Multilabel:
    """Scores (B, K), one independent yes/no per label (logits, or probabilities).
    Answer: ``probabilities`` and ``labels`` (0/1 at ``options.threshold``, default 0.5);
    confidence = the least certain label's certainty, max(p, 1 - p). Right = every label."""

    name = "multilabel"
    metric = "subset_accuracy"
    temperature_fit = True
    answers = (("probabilities", "FP32", 2, ""), ("labels", "INT8", 2, ""))

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        return ("scores",)

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        scores = _matrix(role(raw, task, "scores"), task, "scores").astype(np.float64)
        if task.option("probabilities", False):
            p = np.clip(scores, 1e-7, 1 - 1e-7)
            return np.log(p / (1 - p))
        return scores

    def answer(self, raw: Outputs, task: TaskSpec, temperature: float = 1.0) -> Answer:
        p = sigmoid(self.logits(raw, task), temperature)  # type: ignore[arg-type]
        labels = (p >= float(task.option("threshold", 0.5))).astype(np.int8)
        return Answer({"probabilities": p, "labels": labels}, np.maximum(p, 1 - p).min(axis=1))

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None:
        y = multilabel_targets(y, answer.outputs["labels"].shape)
        return (answer.outputs["labels"] == y).all(axis=1)

    def nll(self, logits: np.ndarray, y: np.ndarray, task: TaskSpec,
            temperature: float) -> float:
        """The binary cross-entropy of each label, averaged."""
        target = multilabel_targets(y, logits.shape).astype(np.float64)
        p = np.clip(sigmoid(logits, temperature).astype(np.float64), 1e-12, 1 - 1e-12)
        return float(-(target * np.log(p) + (1 - target) * np.log(1 - p)).mean())

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None:
        return float(self.correct(answer, y, task).mean())  # type: ignore[union-attr]


class Regression:
    """A value (B,) or (B, D). With an ``uncertainty`` output (a standard deviation, same
    shape), confidence = 1 / (1 + sd) and the answer also carries ``uncertainty``; without
    one, no confidence. Score: R² (clipped at 0); right: |error| <= ``options.tolerance``."""

    name = "regression"
    metric = "r2"
    temperature_fit = False
    answers = (("value", "FP32", -1, "value"), ("uncertainty", "FP32", 1, "uncertainty"))

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        return ("value", "uncertainty")

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        return None

    def answer(self, raw: Outputs, task: TaskSpec, temperature: float = 1.0) -> Answer:
        value = role(raw, task, "value").astype(np.float32)  # type: ignore[union-attr]
        sd = role(raw, task, "uncertainty", required=False)
        if sd is None:
            return Answer({"value": value}, None)
        sd = np.abs(sd.astype(np.float32)).reshape(len(sd), -1).max(axis=1)
        return Answer({"value": value, "uncertainty": sd}, (1.0 / (1.0 + sd)).astype(np.float32))

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None:
        tolerance = task.option("tolerance")
        if tolerance is None:
            return None
        err = np.abs(_flat(answer.outputs["value"]) - _flat(np.asarray(y, np.float64)))
        return err.max(axis=1) <= float(tolerance)

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None:
        pred, true = _flat(answer.outputs["value"]), _flat(np.asarray(y, np.float64))
        if pred.shape != true.shape:
            raise TensorError(f"regression targets must have shape {list(pred.shape)}, "
                              f"got {list(true.shape)}")
        total = float(((true - true.mean(axis=0)) ** 2).sum())
        r2 = 1.0 - float(((true - pred) ** 2).sum()) / total if total > 0 else 0.0
        return max(0.0, r2)


class Embedding:
    """A vector (B, D), answered L2-normalised. Confidence only from a declared
    ``uncertainty`` output (as regression). Score with class labels: leave-one-out
    nearest-neighbour accuracy (cosine) — how well the vectors keep the classes apart."""

    name = "embedding"
    metric = "nn_accuracy"
    temperature_fit = False
    answers = (("embedding", "FP32", 2, ""), ("uncertainty", "FP32", 1, "uncertainty"))

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        return ("vector", "uncertainty")

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        return None

    def answer(self, raw: Outputs, task: TaskSpec, temperature: float = 1.0) -> Answer:
        v = _matrix(role(raw, task, "vector"), task, "vector").astype(np.float32)
        v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
        sd = role(raw, task, "uncertainty", required=False)
        if sd is None:
            return Answer({"embedding": v}, None)
        sd = np.abs(sd.astype(np.float32)).reshape(len(sd), -1).max(axis=1)
        return Answer({"embedding": v, "uncertainty": sd}, (1.0 / (1.0 + sd)).astype(np.float32))

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None:
        y = np.asarray(y).reshape(-1)
        v = answer.outputs["embedding"]
        if len(v) < 2 or len(y) != len(v):
            return None
        sim = v @ v.T
        np.fill_diagonal(sim, -np.inf)
        return y[sim.argmax(axis=1)] == y

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None:
        ok = self.correct(answer, y, task)
        return None if ok is None else float(ok.mean())


def class_ids(y: np.ndarray, scores_shape: tuple[int, ...]) -> np.ndarray:
    """(N,) class ids, refused unless whole numbers in range, one per scored row."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:  # a column of ids
        y = y.reshape(-1)
    n, classes = scores_shape
    if y.ndim != 1 or len(y) != n:
        raise TensorError(f"classification labels must be (N,) = ({n},) class ids, got "
                          f"shape {list(y.shape)}")
    if y.dtype.kind not in "iub" and not (y.dtype.kind == "f" and np.all(y == np.round(y))):
        raise TensorError(f"classification labels must be whole class ids, got {y.dtype} "
                          "values such as " + ", ".join(str(v) for v in y[:3].tolist()))
    ids = y.astype(np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= classes):
        raise TensorError(f"labels run {ids.min()}..{ids.max()} but the model scores "
                          f"{classes} classes (ids 0..{classes - 1})")
    return ids


def multilabel_targets(y: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(N, K) 0/1 targets, refused unless they match the model's (N, K) and are 0 or 1."""
    y = np.asarray(y)
    if y.shape != tuple(shape):
        raise TensorError(f"multilabel targets must be (N, K) = {list(shape)}, got "
                          f"{list(y.shape)}")
    if not np.isin(y, (0, 1)).all():
        raise TensorError("multilabel targets must be 0 or 1")
    return y.astype(bool)


def _matrix(x: np.ndarray | None, task: TaskSpec, what: str) -> np.ndarray:
    if x is None or x.ndim != 2:
        raise TensorError(f"task {task.name!r}: the model's {what} must be (batch, N), "
                          f"got shape {None if x is None else list(x.shape)}")
    return x


def _flat(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64).reshape(len(x), -1)


def check_kind_outputs(kind: OutputKind, task: TaskSpec, output_names: list[str]) -> None:
    """Refuse a model whose outputs cannot give the task's roles (named in the error)."""
    for r in kind.roles(task):
        declared = task.output(r)
        if declared is not None and declared not in output_names:
            raise ConfigError(f"task {task.name!r} reads output {declared!r} as {r!r}, but "
                              f"the model's outputs are {output_names}",
                              hint="export the model with that output name, or declare "
                                   "the task's outputs to match")
    first = kind.roles(task)[0]
    if task.output(first) is None and len(output_names) != 1:
        raise ConfigError(f"task {task.name!r}: the model has outputs {output_names}; say "
                          f"which one is the {first!r}",
                          hint=f"declare the task's outputs: {{{first}: NAME}}")
