"""The ``detection`` output kind on hand-made boxes: IoU, per-image F1 with greedy
matching, the confidence read from the scores, what it refuses."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest

from tierlink.errors import TensorError
from tierlink.models.detection import Detection, iou
from tierlink.models.task import TaskSpec
from tierlink.models.tensors import TensorDecl

ROLES = {"boxes": "boxes", "scores": "scores"}


def task(outputs: dict[str, str] | None = None, **options: object) -> TaskSpec:
    return TaskSpec("det", "detection", (TensorDecl("x", "FP32", (-1, 10)),),
                    MappingProxyType(ROLES if outputs is None else outputs), (),
                    MappingProxyType(options))


def raw(boxes: list[list[list[float]]], scores: list[list[float]],
        classes: list[list[int]] | None = None) -> dict[str, np.ndarray]:
    out = {"boxes": np.array(boxes, np.float32), "scores": np.array(scores, np.float32)}
    if classes is not None:
        out["classes"] = np.array(classes, np.int64)
    return out


def truth(*rows: list[float], pad_to: int = 0) -> np.ndarray:
    """One image's ground truth (G, 5), padded with class -1 rows."""
    rows_ = [list(r) for r in rows] + [[0, 0, 0, 0, -1]] * (pad_to - len(rows))
    return np.array(rows_, np.float64).reshape(-1, 5)


def test_iou_by_hand():
    a = np.array([[0, 0, 2, 2]], np.float64)
    b = np.array([[1, 1, 3, 3], [0, 0, 2, 2], [5, 5, 6, 6], [0, 0, 0, 0]], np.float64)
    # overlap 1, union 4 + 4 - 1 = 7; identical; disjoint; an empty box
    np.testing.assert_allclose(iou(a, b), [[1 / 7, 1.0, 0.0, 0.0]])


def test_one_match_and_one_false_positive_is_f1_two_thirds():
    kind, t = Detection(), task()
    ans = kind.answer(raw([[[0, 0, 10, 10], [20, 20, 30, 30]]], [[0.9, 0.8]]), t)
    y = truth([0, 0, 10, 10, 0])[None]  # (1, 1, 5)
    assert kind.score(ans, y, t) == pytest.approx(2 * 1 / (2 + 1))
    assert kind.correct(ans, y, t).tolist() == [False]


def test_detections_below_keep_are_dropped_and_the_image_is_right():
    kind, t = Detection(), task()
    ans = kind.answer(raw([[[0, 0, 10, 10], [20, 20, 30, 30]]], [[0.9, 0.3]]), t)
    y = truth([1, 1, 10, 10, 0], pad_to=3)[None]  # IoU 81 / 100 >= 0.5
    assert kind.score(ans, y, t) == 1.0 and kind.correct(ans, y, t).tolist() == [True]
    # a stricter keep drops the true one too: nothing kept, one box missed
    assert kind.score(kind.answer(raw([[[0, 0, 10, 10], [20, 20, 30, 30]]], [[0.9, 0.3]]),
                                  task(keep=0.95)), y, task(keep=0.95)) == 0.0


def test_the_iou_option_decides_a_loose_box():
    kind = Detection()
    boxes, y = [[[0, 0, 10, 10]]], truth([5, 0, 15, 10, 0])[None]  # IoU 50 / 150 = 1/3
    assert kind.score(kind.answer(raw(boxes, [[0.9]]), task()), y, task()) == 0.0
    loose = task(iou=0.3)
    assert kind.score(kind.answer(raw(boxes, [[0.9]]), loose), y, loose) == 1.0


def test_classes_must_agree():
    kind, t = Detection(), task({**ROLES, "classes": "classes"})
    ans = kind.answer(raw([[[0, 0, 10, 10]]], [[0.9]], [[2]]), t)
    assert ans.outputs["classes"].tolist() == [[2]]
    assert kind.score(ans, truth([0, 0, 10, 10, 2])[None], t) == 1.0
    assert kind.score(ans, truth([0, 0, 10, 10, 1])[None], t) == 0.0


def test_without_a_classes_output_every_detection_is_class_zero():
    ans = Detection().answer(raw([[[0, 0, 1, 1]]], [[0.9]]), task())
    assert ans.outputs["classes"].tolist() == [[0]] and ans.outputs["classes"].dtype == np.int64


def test_greedy_matching_is_one_to_one():
    kind, t = Detection(), task()
    # two predictions on the same true box, one more true box nobody found
    ans = kind.answer(raw([[[0, 0, 10, 10], [0, 0, 10, 9]]], [[0.9, 0.9]]), t)
    y = truth([0, 0, 10, 10, 0], [50, 50, 60, 60, 0])[None]
    assert kind.score(ans, y, t) == pytest.approx(2 * 1 / (2 + 2))


def test_nothing_found_where_nothing_is_is_right_and_per_image_f1_is_averaged():
    kind, t = Detection(), task()
    ans = kind.answer(raw([[[0, 0, 1, 1]], [[0, 0, 10, 10]]], [[0.05], [0.9]]), t)
    y = np.stack([truth(pad_to=1), truth([20, 20, 30, 30, 0])])  # (2, 1, 5)
    assert kind.correct(ans, y, t).tolist() == [True, False]
    assert kind.score(ans, y, t) == 0.5


def test_confidence_is_the_least_certain_candidate_above_the_floor():
    kind, t = Detection(), task()
    ans = kind.answer(raw([[[0, 0, 1, 1]] * 3, [[0, 0, 1, 1]] * 3, [[0, 0, 1, 1]] * 3],
                          [[0.9, 0.8, 0.05], [0.6, 0.3, 0.95], [0.01, 0.02, 0.03]]), t)
    # image 0: 0.9, 0.8 (0.05 is below the floor); image 1: max(s, 1 - s) = 0.6, 0.7, 0.95;
    # image 2: no candidate at all -- sure there is nothing
    np.testing.assert_allclose(ans.confidence, [0.8, 0.6, 1.0], rtol=1e-6)
    higher = kind.answer(raw([[[0, 0, 1, 1]] * 2], [[0.9, 0.3]]), task(floor=0.5))
    np.testing.assert_allclose(higher.confidence, [0.9], rtol=1e-6)


@pytest.mark.parametrize("outputs, bad", [
    ({"boxes": "boxes"}, raw([[[0, 0, 1, 1]]], [[0.5]])),  # scores not declared
    (ROLES, {"boxes": np.zeros((1, 2, 3), np.float32), "scores": np.zeros((1, 2), np.float32)}),
    (ROLES, {"boxes": np.zeros((1, 2, 4), np.float32), "scores": np.zeros((1, 3), np.float32)}),
    (ROLES, {"boxes": np.zeros((2, 4), np.float32), "scores": np.zeros((2,), np.float32)}),
])
def test_outputs_that_are_not_boxes_and_scores_are_refused(outputs, bad):
    with pytest.raises(TensorError, match=r"boxes \(B, M, 4\) and scores \(B, M\)"):
        Detection().answer(bad, task(outputs))


@pytest.mark.parametrize("shape", [(1, 1, 4), (2, 1, 5), (1, 5)])
def test_labels_must_be_rows_of_box_and_class(shape):
    kind, t = Detection(), task()
    ans = kind.answer(raw([[[0, 0, 1, 1]]], [[0.9]]), t)
    with pytest.raises(TensorError, match=r"detection labels must be \(N=1, G, 5\)"):
        kind.score(ans, np.zeros(shape), t)


def test_detection_has_no_temperature_and_reads_three_roles():
    kind, t = Detection(), task()
    assert kind.metric == "f1@iou" and kind.temperature_fit is False
    assert kind.logits(raw([[[0, 0, 1, 1]]], [[0.9]]), t) is None
    assert kind.roles(t) == ("boxes", "scores", "classes")
