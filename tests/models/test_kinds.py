"""Output kinds (``tasks/kinds.py``) on small hand-computed arrays: the answer and its
confidence, the metric, per-sample correctness, which output plays which role."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest

from tierlink.errors import ConfigError, TensorError
from tierlink.models.kinds import (
    Classification,
    Embedding,
    Multilabel,
    Regression,
    check_kind_outputs,
    role,
    sigmoid,
    softmax,
)
from tierlink.models.task import TaskSpec
from tierlink.models.tensors import TensorDecl

X = (TensorDecl("x", "FP32", (-1, 4)),)


def task(kind: str, outputs: dict[str, str] | None = None, **options: object) -> TaskSpec:
    return TaskSpec("t", kind, X, MappingProxyType(outputs or {}), (),
                    MappingProxyType(options))


def f32(*rows: object) -> np.ndarray:
    return np.array(rows, np.float32)


# -- roles ---------------------------------------------------------------------------------

def test_role_reads_the_declared_output():
    raw = {"a": f32(1.0), "b": f32(2.0)}
    assert role(raw, task("regression", {"value": "b"}), "value")[0] == 2.0


def test_role_of_a_one_output_model_is_that_output():
    assert role({"only": f32(3.0)}, task("regression"), "value")[0] == 3.0


def test_an_optional_role_not_declared_is_none():
    assert role({"only": f32(3.0)}, task("regression"), "uncertainty", required=False) is None


def test_a_declared_output_the_model_lacks_is_a_tensor_error():
    with pytest.raises(TensorError, match=r"reads output 'sd' as uncertainty.*\['value'\]"):
        role({"value": f32(1.0)}, task("regression", {"uncertainty": "sd"}), "uncertainty")


def test_an_ambiguous_role_is_a_tensor_error_with_the_fix():
    with pytest.raises(TensorError) as err:
        role({"a": f32(1.0), "b": f32(2.0)}, task("regression"), "value")
    assert "does not say which of the outputs ['a', 'b'] is its 'value'" in err.value.message
    assert err.value.hint == "declare outputs: {value: OUTPUT_NAME}"


def test_check_kind_outputs_refuses_a_declared_output_the_model_lacks():
    with pytest.raises(ConfigError, match=r"reads output 'sd' as 'uncertainty'"):
        check_kind_outputs(Regression(), task("regression", {"value": "value",
                                                            "uncertainty": "sd"}), ["value"])


def test_check_kind_outputs_asks_which_output_of_several_is_the_first_role():
    with pytest.raises(ConfigError) as err:
        check_kind_outputs(Regression(), task("regression"), ["value", "sd"])
    assert "say which one is the 'value'" in err.value.message
    assert "{value: NAME}" in err.value.hint


def test_check_kind_outputs_accepts_one_output_or_declared_roles():
    check_kind_outputs(Classification(), task("classification"), ["logits"])
    check_kind_outputs(Regression(), task("regression", {"value": "value"}), ["value", "sd"])


# -- helpers -------------------------------------------------------------------------------

def test_softmax_and_sigmoid_with_a_temperature():
    np.testing.assert_allclose(softmax(f32([0.0, np.log(3.0)])), [[0.25, 0.75]], rtol=1e-6)
    # T = 2 halves the logits: ln 3 / 2 = ln sqrt(3)
    np.testing.assert_allclose(softmax(f32([0.0, np.log(3.0)]), 2.0),
                               [[1 / (1 + 3 ** 0.5), 3 ** 0.5 / (1 + 3 ** 0.5)]], rtol=1e-6)
    np.testing.assert_allclose(sigmoid(f32(0.0, np.log(4.0))), [0.5, 0.8], rtol=1e-6)
    np.testing.assert_allclose(sigmoid(f32(np.log(4.0)), 2.0), [2 / 3], rtol=1e-6)


# -- classification ------------------------------------------------------------------------

def test_classification_answers_probabilities_label_and_top1_confidence():
    kind, t = Classification(), task("classification")
    logits = f32([np.log(3.0), 0.0, 0.0], [0.0, 0.0, np.log(8.0)])
    ans = kind.answer({"logits": logits}, t)
    np.testing.assert_allclose(ans.outputs["probabilities"], [[0.6, 0.2, 0.2], [0.1, 0.1, 0.8]],
                               rtol=1e-6)
    assert ans.outputs["label"].tolist() == [0, 2] and ans.outputs["label"].dtype == np.int64
    np.testing.assert_allclose(ans.confidence, [0.6, 0.8], rtol=1e-6)
    assert kind.correct(ans, np.array([0, 1]), t).tolist() == [True, False]
    assert kind.score(ans, np.array([[0], [2]]), t) == 1.0  # (N, 1) targets are flattened


def test_classification_temperature_softens_the_confidence():
    kind, t = Classification(), task("classification")
    logits = f32([np.log(9.0), 0.0])  # p = 0.9 at T = 1; 3 : 1 at T = 2
    np.testing.assert_allclose(kind.answer({"l": logits}, t, 2.0).confidence, [0.75], rtol=1e-6)


def test_a_probabilities_classifier_gives_its_probabilities_back():
    kind, t = Classification(), task("classification", probabilities=True)
    probs = f32([0.7, 0.2, 0.1], [0.1, 0.3, 0.6])
    ans = kind.answer({"p": probs}, t)
    np.testing.assert_allclose(ans.outputs["probabilities"], probs, rtol=1e-5)
    np.testing.assert_allclose(kind.logits({"p": probs}, t), np.log(probs), rtol=1e-6)
    assert ans.outputs["label"].tolist() == [0, 2]


def test_classification_scores_must_be_a_matrix():
    with pytest.raises(TensorError, match=r"must be \(batch, N\), got shape \[3\]"):
        Classification().answer({"l": f32(1.0, 2.0, 3.0)}, task("classification"))


# -- multilabel ----------------------------------------------------------------------------

def test_multilabel_confidence_is_the_least_certain_label():
    kind, t = Multilabel(), task("multilabel")
    logits = f32([np.log(4.0), -np.log(9.0), np.log(1.5)],  # p = 0.8, 0.1, 0.6
                 [np.log(19.0), -np.log(19.0), np.log(3.0)])  # p = 0.95, 0.05, 0.75
    ans = kind.answer({"s": logits}, t)
    np.testing.assert_allclose(ans.outputs["probabilities"], [[0.8, 0.1, 0.6],
                                                              [0.95, 0.05, 0.75]], rtol=1e-5)
    assert ans.outputs["labels"].tolist() == [[1, 0, 1], [1, 0, 1]]
    np.testing.assert_allclose(ans.confidence, [0.6, 0.75], rtol=1e-5)
    y = np.array([[1, 0, 1], [1, 1, 1]])
    assert kind.correct(ans, y, t).tolist() == [True, False]  # right = every label right
    assert kind.score(ans, y, t) == 0.5


def test_multilabel_threshold_option_moves_the_labels():
    logits = f32([np.log(4.0), np.log(1.5)])  # p = 0.8, 0.6
    ans = Multilabel().answer({"s": logits}, task("multilabel", threshold=0.7))
    assert ans.outputs["labels"].tolist() == [[1, 0]]


def test_multilabel_from_probabilities():
    kind, t = Multilabel(), task("multilabel", probabilities=True)
    probs = f32([0.8, 0.1])
    np.testing.assert_allclose(kind.answer({"p": probs}, t).outputs["probabilities"], probs,
                               rtol=1e-5)
    np.testing.assert_allclose(kind.logits({"p": probs}, t), [[np.log(4.0), -np.log(9.0)]],
                               rtol=1e-5)


def test_multilabel_targets_of_another_shape_are_refused():
    kind, t = Multilabel(), task("multilabel")
    ans = kind.answer({"s": f32([1.0, -1.0, 0.5])}, t)
    with pytest.raises(TensorError, match=r"\(N, K\) = \[1, 3\], got \[1, 2\]"):
        kind.correct(ans, np.array([[1, 0]]), t)


# -- regression ----------------------------------------------------------------------------

def test_regression_r2_and_tolerance():
    kind = Regression()
    ans = kind.answer({"v": f32(1.0, 2.0, 3.0, 4.0)}, task("regression"))
    assert set(ans.outputs) == {"value"} and ans.confidence is None
    y = np.array([1.0, 2.0, 3.0, 5.0])
    # SS_res = 1; SS_tot = 1.75² + 0.75² + 0.25² + 2.25² = 8.75
    assert kind.score(ans, y, task("regression")) == pytest.approx(1 - 1 / 8.75)
    assert kind.correct(ans, y, task("regression")) is None  # no tolerance: no "right"
    assert kind.correct(ans, y, task("regression", tolerance=0.5)).tolist() == \
        [True, True, True, False]
    assert kind.correct(ans, y, task("regression", tolerance=1.0)).all()


def test_regression_r2_is_clipped_at_zero_and_zero_for_constant_targets():
    kind, t = Regression(), task("regression")
    ans = kind.answer({"v": f32(4.0, 3.0, 2.0, 1.0)}, t)
    assert kind.score(ans, np.array([1.0, 2.0, 3.0, 4.0]), t) == 0.0  # R² = -3, clipped
    assert kind.score(ans, np.full(4, 2.0), t) == 0.0


def test_regression_with_uncertainty_is_confident_as_one_over_one_plus_sd():
    kind = Regression()
    t = task("regression", {"value": "value", "uncertainty": "sd"})
    ans = kind.answer({"value": f32(1.0, 2.0, 3.0), "sd": f32(0.0, -1.0, 3.0)}, t)
    np.testing.assert_allclose(ans.outputs["uncertainty"], [0.0, 1.0, 3.0])  # |sd|
    np.testing.assert_allclose(ans.confidence, [1.0, 0.5, 0.25])


def test_multi_target_regression_takes_the_largest_sd_and_error():
    kind = Regression()
    t = task("regression", {"value": "value", "uncertainty": "sd"}, tolerance=0.5)
    ans = kind.answer({"value": f32([1.0, 1.0], [2.0, 2.0]),
                       "sd": f32([0.0, 1.0], [0.25, 0.0])}, t)
    np.testing.assert_allclose(ans.confidence, [0.5, 0.8])
    y = np.array([[1.0, 1.2], [2.0, 2.9]])
    assert kind.correct(ans, y, t).tolist() == [True, False]


def test_regression_targets_of_another_shape_are_refused():
    kind, t = Regression(), task("regression")
    ans = kind.answer({"v": f32(1.0, 2.0)}, t)
    with pytest.raises(TensorError, match=r"targets must have shape \[2, 1\], got \[2, 2\]"):
        kind.score(ans, np.ones((2, 2)), t)


# -- embedding -----------------------------------------------------------------------------

def test_embedding_is_normalised_and_scored_by_nearest_neighbour():
    kind, t = Embedding(), task("embedding")
    v = f32([2.0, 0.0], [0.9, 0.1], [0.0, 3.0], [0.8, 0.2])
    ans = kind.answer({"v": v}, t)
    np.testing.assert_allclose(np.linalg.norm(ans.outputs["embedding"], axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(ans.outputs["embedding"][0], [1.0, 0.0])
    assert ans.confidence is None
    # nearest by cosine (leaving itself out): 0 -> 1, 1 -> 0, 2 -> 3, 3 -> 1 (class 0, wrong)
    y = np.array([0, 0, 1, 1])
    assert kind.correct(ans, y, t).tolist() == [True, True, True, False]
    assert kind.score(ans, y, t) == 0.75


def test_embedding_without_neighbours_or_labels_has_no_score():
    kind, t = Embedding(), task("embedding")
    one = kind.answer({"v": f32([1.0, 0.0])}, t)
    assert kind.correct(one, np.array([0]), t) is None and kind.score(one, np.array([0]), t) is None
    two = kind.answer({"v": f32([1.0, 0.0], [0.0, 1.0])}, t)
    assert kind.score(two, np.array([0, 1, 2]), t) is None


def test_embedding_with_uncertainty():
    t = task("embedding", {"vector": "v", "uncertainty": "sd"})
    ans = Embedding().answer({"v": f32([3.0, 4.0]), "sd": f32(1.0)}, t)
    np.testing.assert_allclose(ans.outputs["embedding"], [[0.6, 0.8]], rtol=1e-6)
    np.testing.assert_allclose(ans.confidence, [0.5])


@pytest.mark.parametrize("kind, metric, fit", [
    (Classification(), "accuracy", True), (Multilabel(), "subset_accuracy", True),
    (Regression(), "r2", False), (Embedding(), "nn_accuracy", False),
])
def test_each_kind_states_its_metric_and_whether_a_temperature_is_fitted(kind, metric, fit):
    assert kind.metric == metric and kind.temperature_fit is fit
    assert (kind.logits({"o": f32([1.0, 2.0])}, task(kind.name)) is not None) is fit
