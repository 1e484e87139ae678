"""An output kind for semantic segmentation: a class for every pixel.

The model gives per-pixel class scores, logits shaped (batch, classes, height, width). The
kind answers the ``mask`` (batch, height, width) of the most likely class per pixel, and
its confidence: the mean top probability over the pixels it does not call background
(class ``options.background``, default 0; over every pixel when it sees no object), after
the temperature fitted on the calibration data on the per-pixel likelihood. An answer is
right when its mean IoU over the classes the image or the answer holds reaches
``options.iou`` (default 0.5); the task's metric is the mean IoU over the data's classes.
Labels are masks (batch, height, width) of class ids. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tierlink.errors import TensorError
from tierlink.models.kinds import Answer, role
from tierlink.models.task import TaskSpec


class Segmentation:
    """Scores (B, C, H, W). Answer: ``mask`` (B, H, W); confidence = mean top probability
    over the object pixels. Right: the image's mean IoU >= ``options.iou``."""

    name = "segmentation"
    metric = "miou"
    temperature_fit = True
    answers = (("mask", "INT64", 3, ""),)  # (name, OIP datatype, rank, role)

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        return ("scores",)

    def logits(self, raw: Mapping[str, np.ndarray], task: TaskSpec) -> np.ndarray | None:
        scores = role(raw, task, "scores")
        if scores is None or scores.ndim != 4:
            raise TensorError(f"task {task.name!r}: segmentation scores must be (batch, "
                              f"classes, height, width), got "
                              f"{None if scores is None else list(scores.shape)}")
        return scores.astype(np.float64)

    def answer(self, raw: Mapping[str, np.ndarray], task: TaskSpec,
               temperature: float = 1.0) -> Answer:
        p = _softmax(self.logits(raw, task), temperature)  # type: ignore[arg-type]
        mask = p.argmax(axis=1)
        top = p.max(axis=1)
        objects = mask != int(task.option("background", 0))
        counted = np.where(objects.any(axis=(1, 2))[:, None, None], objects, True)
        confidence = (top * counted).sum(axis=(1, 2)) / counted.sum(axis=(1, 2))
        return Answer({"mask": mask.astype(np.int64)}, confidence.astype(np.float32))

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None:
        mask = answer.outputs["mask"]
        truth = _masks(y, mask.shape)
        classes = int(max(mask.max(initial=0), truth.max(initial=0))) + 1
        inter, union = _overlap(mask, truth, classes, axis=1)  # (B, C) per image
        iou = np.where(union > 0, inter / np.maximum(union, 1), 0.0).sum(axis=1) \
            / np.maximum((union > 0).sum(axis=1), 1)
        return iou >= float(task.option("iou", 0.5))

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None:
        mask = answer.outputs["mask"]
        truth = _masks(y, mask.shape)
        classes = int(max(mask.max(initial=0), truth.max(initial=0))) + 1
        inter, union = _overlap(mask, truth, classes, axis=0)  # (C,) over the data
        present = union > 0
        return float((inter[present] / union[present]).mean()) if present.any() else 0.0

    def nll(self, logits: np.ndarray, y: np.ndarray, task: TaskSpec,
            temperature: float) -> float:
        """The per-pixel cross-entropy, averaged over every pixel."""
        truth = _masks(y, (logits.shape[0], *logits.shape[2:]))
        if truth.max(initial=0) >= logits.shape[1]:
            raise TensorError(f"mask labels run to {truth.max()} but the model scores "
                              f"{logits.shape[1]} classes")
        p = _softmax(logits, temperature)
        picked = np.take_along_axis(p, truth[:, None], axis=1)
        return float(-np.log(np.clip(picked, 1e-12, None)).mean())


def _softmax(z: np.ndarray, temperature: float) -> np.ndarray:
    z = z / max(temperature, 1e-6)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _masks(y: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The label masks as class ids, refused unless (B, H, W) whole numbers >= 0."""
    y = np.asarray(y)
    if y.shape != tuple(shape):
        raise TensorError(f"segmentation labels must be masks of shape {list(shape)}, got "
                          f"{list(y.shape)}")
    if y.dtype.kind not in "iu" or (y.size and y.min() < 0):
        raise TensorError("segmentation labels must be class ids (whole numbers >= 0)")
    return y.astype(np.int64)


def _overlap(mask: np.ndarray, truth: np.ndarray, classes: int,
             axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Intersection and union counts per class: per image (axis=1, shape (B, C)) or over
    the whole data (axis=0, shape (C,))."""
    pred = mask[..., None] == np.arange(classes)
    true = truth[..., None] == np.arange(classes)
    inter = (pred & true).reshape(len(mask), -1, classes).sum(axis=1)
    union = (pred | true).reshape(len(mask), -1, classes).sum(axis=1)
    return (inter, union) if axis == 1 else (inter.sum(axis=0), union.sum(axis=0))
