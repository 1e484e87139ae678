"""The third-party output kind of ``examples/output_kind/`` (installed with ``pip install
-e`` by setup): ``segmentation`` registered by its entry point; masks, confidence over the
object pixels, per-image IoU as right or wrong, mean IoU as the metric, a temperature fitted
on the per-pixel likelihood; labels of the wrong shape refused."""

from __future__ import annotations

import numpy as np
import pytest

from tierlink.errors import TensorError
from tierlink.models.calibration import kind_temperature
from tierlink.models.kind_registry import kind_of
from tierlink.models.task import TaskSpec
from tierlink.models.tensors import TensorDecl

TASK = TaskSpec("masks", "segmentation", (TensorDecl("image", "FP32", (-1, 1, 2, 2)),),
                options={"iou": 0.5})


def scores(masks: np.ndarray, classes: int = 3, sure: float = 4.0) -> np.ndarray:
    """Logits (B, C, H, W) peaked at ``masks``' classes, ``sure`` apart."""
    onehot = masks[:, None] == np.arange(classes)[None, :, None, None]
    return (sure * onehot).astype(np.float32)


def test_the_package_registers_its_kind() -> None:
    from tierlink_example_kinds import Segmentation

    assert isinstance(kind_of("segmentation"), Segmentation)


def test_the_answer_is_a_mask_and_the_confidence_counts_the_object_pixels() -> None:
    kind = kind_of("segmentation")
    masks = np.array([[[0, 1], [1, 1]], [[0, 0], [0, 0]]])
    raw = scores(masks)
    raw[0, :, 0, 0] = 0.0  # unsure of a background pixel: it does not count
    answer = kind.answer({"scores": raw}, TASK)
    assert answer.outputs["mask"].dtype == np.int64
    np.testing.assert_array_equal(answer.outputs["mask"][1], masks[1])
    sure = np.exp(4.0) / (np.exp(4.0) + 2)
    np.testing.assert_allclose(answer.confidence, [sure, sure], rtol=1e-5)


def test_right_is_an_images_iou_and_the_metric_the_datas_mean_iou() -> None:
    kind = kind_of("segmentation")
    truth = np.array([[[0, 1], [1, 1]], [[0, 2], [2, 2]]])
    guess = np.array([[[0, 1], [1, 1]], [[0, 1], [1, 1]]])  # the second image's class wrong
    answer = kind.answer({"scores": scores(guess)}, TASK)
    assert kind.correct(answer, truth, TASK).tolist() == [True, False]
    # background 2/2, class 1: 3 of 6 pixels, class 2: 0 of 3
    assert kind.score(answer, truth, TASK) == pytest.approx((1.0 + 0.5 + 0.0) / 3)


def test_the_temperature_is_fitted_on_the_per_pixel_likelihood() -> None:
    kind = kind_of("segmentation")
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 3, size=(40, 2, 2))
    guess = np.where(rng.random(truth.shape) < 0.7, truth, (truth + 1) % 3)
    t, before, after = kind_temperature(kind, {"scores": scores(guess, sure=8.0)}, truth, TASK)
    assert t > 1.0 and after < before  # over-confident logits are softened


def test_labels_of_the_wrong_shape_or_kind_are_refused() -> None:
    kind = kind_of("segmentation")
    answer = kind.answer({"scores": scores(np.zeros((2, 2, 2), int))}, TASK)
    with pytest.raises(TensorError, match=r"masks of shape \[2, 2, 2\]"):
        kind.score(answer, np.zeros(2, int), TASK)
    with pytest.raises(TensorError, match="class ids"):
        kind.correct(answer, np.full((2, 2, 2), 0.5), TASK)
    with pytest.raises(TensorError, match="height, width"):
        kind.answer({"scores": np.zeros((2, 3), np.float32)}, TASK)
