"""The ``detection`` output kind: boxes with scores (and classes), fixed slots per image.

Outputs by role: ``boxes`` (B, M, 4) as x1, y1, x2, y2; ``scores`` (B, M); optionally
``classes`` (B, M). A detection is *kept* when its score reaches ``options.keep`` (0.5).
Confidence per image comes from the scores themselves: every candidate above
``options.floor`` (0.1) is a decision keep-or-drop, and the least certain one,
max(s, 1 - s), is the image's confidence (no candidate at all: sure there is nothing).

Labels (``y``) are (N, G, 5): x1, y1, x2, y2, class per ground-truth box, padded with rows
whose class is -1. An image is right when its kept detections and its boxes match one to
one (same class, IoU >= ``options.iou``, 0.5); the score is the mean per-image F1.
"""

from __future__ import annotations

import numpy as np

from tierlink.errors import TensorError
from tierlink.models.kinds import Answer, Outputs, role
from tierlink.models.task import TaskSpec


class Detection:
    name = "detection"
    metric = "f1@iou"
    temperature_fit = False
    answers = (("boxes", "FP32", 3, ""), ("scores", "FP32", 2, ""),
               ("classes", "INT64", 2, ""))

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        return ("boxes", "scores", "classes")

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        return None

    def answer(self, raw: Outputs, task: TaskSpec, temperature: float = 1.0) -> Answer:
        boxes = role(raw, task, "boxes", required=False)
        scores = role(raw, task, "scores", required=False)
        if boxes is None or scores is None or boxes.ndim != 3 or boxes.shape[-1] != 4 \
                or scores.shape != boxes.shape[:2]:
            raise TensorError(f"task {task.name!r}: a detector gives boxes (B, M, 4) and "
                              "scores (B, M)", hint="declare outputs: {boxes: ..., scores: ...}")
        classes = role(raw, task, "classes", required=False)
        classes = (np.zeros(scores.shape, np.int64) if classes is None
                   else classes.astype(np.int64))
        floor = float(task.option("floor", 0.1))
        certainty = np.where(scores >= floor, np.maximum(scores, 1.0 - scores), 1.0)
        return Answer({"boxes": boxes.astype(np.float32), "scores": scores.astype(np.float32),
                       "classes": classes}, certainty.min(axis=1).astype(np.float32))

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None:
        return self._f1(answer, y, task) >= 1.0

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None:
        return float(self._f1(answer, y, task).mean())

    def _f1(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray:
        y = np.asarray(y, np.float64)
        n = len(answer.outputs["boxes"])
        if y.ndim != 3 or y.shape[0] != n or y.shape[2] != 5:
            raise TensorError(f"detection labels must be (N={n}, G, 5) rows of x1, y1, x2, "
                              f"y2, class (class -1 pads), got {list(y.shape)}")
        keep, iou = float(task.option("keep", 0.5)), float(task.option("iou", 0.5))
        out = np.empty(n)
        for i in range(n):
            kept = answer.outputs["scores"][i] >= keep
            pred_boxes = answer.outputs["boxes"][i][kept]
            pred_cls = answer.outputs["classes"][i][kept]
            truth = y[i][y[i][:, 4] >= 0]
            out[i] = _image_f1(pred_boxes, pred_cls, truth[:, :4], truth[:, 4], iou)
        return out


def _image_f1(boxes: np.ndarray, classes: np.ndarray, truth: np.ndarray, truth_cls: np.ndarray,
              iou_min: float) -> float:
    if len(boxes) == 0 and len(truth) == 0:
        return 1.0
    if len(boxes) == 0 or len(truth) == 0:
        return 0.0
    overlap = iou(boxes, truth) * (classes[:, None] == truth_cls[None, :])
    matched, used = 0, set()
    for p in np.argsort(-overlap.max(axis=1)):  # greedy, best overlaps first
        g = int(np.argmax(np.where([j in used for j in range(len(truth))], -1.0, overlap[p])))
        if g not in used and overlap[p, g] >= iou_min:
            used.add(g)
            matched += 1
    return 2.0 * matched / (len(boxes) + len(truth))


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(A, B) intersection over union of boxes x1, y1, x2, y2."""
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(hi - lo, 0, None).prod(axis=2)
    area = lambda x: np.clip(x[:, 2:] - x[:, :2], 0, None).prod(axis=1)
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)
