"""What retraining decides without training: the hard examples' labels, the verdict on a new
version against its parent, and the trainers' registry."""

from __future__ import annotations

import numpy as np
import pytest

from tierlink.errors import ConfigError, InvalidRequest
from tierlink.retrain import TRAINERS, judge, label_examples


def test_a_hard_example_keeps_its_own_label_else_takes_the_most_capable_models():
    x = np.arange(5, dtype=np.float32).reshape(5, 1)
    data, own, taught = label_examples(x, np.array([3, -1, 1, -1, -1]),
                                       np.array([9, 7, 9, 6, 5]))
    assert data.labels.tolist() == [3, 7, 1, 6, 5] and (own, taught) == (2, 3)
    unlabelled, own, taught = label_examples(x, np.array([3, -1, 1, -1, -1]), None)
    assert unlabelled.labels.tolist() == [3, 1] and unlabelled.input[:, 0].tolist() == [0, 2]
    with pytest.raises(InvalidRequest, match="5 hard examples but 4 labels"):
        label_examples(x, np.array([1, 2, 3, 4]), None)


def probs(pred: list[int], conf: list[float], k: int = 3) -> np.ndarray:
    out = np.full((len(pred), k), 0.0)
    for i, (p, c) in enumerate(zip(pred, conf, strict=True)):
        out[i] = (1 - c) / (k - 1)
        out[i, p] = c
    return out


def test_a_version_is_better_only_on_its_hard_slice_without_losing_the_rest():
    y = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    # the parent: right on the confident six, wrong on the two it passes up (conf < 0.9)
    parent = probs([0, 1, 2, 0, 1, 2, 1, 0], [0.99] * 6 + [0.5, 0.6])
    fixed = probs([0, 1, 2, 0, 1, 2, 0, 0], [0.99] * 8)  # learnt one of the hard two
    verdict = judge(y, parent, fixed, threshold=0.9)
    assert verdict.better and verdict.n_hard == 2
    assert (verdict.parent_hard_slice, verdict.hard_slice) == (0.0, 50.0)
    assert verdict.reason.startswith("hard slice 50.00% vs 0.00% (+50.00 pt over 2)")
    # learnt it, but forgot two confident ones: 5/8 right against the parent's 6/8
    traded = probs([0, 1, 2, 0, 0, 0, 0, 0], [0.99] * 8)
    assert not judge(y, parent, traded, threshold=0.9).better
    assert judge(y, parent, traded, threshold=0.9, max_drop_pt=100).better
    assert not judge(y, parent, parent, threshold=0.9).better  # no gain: not published
    with pytest.raises(InvalidRequest, match="no input the parent passes up"):
        judge(y, parent, fixed, threshold=0.1)


def test_the_zoos_trainer_is_registered_and_an_unknown_one_is_named():
    assert "zoo" in TRAINERS.names()
    with pytest.raises(ConfigError, match="unknown trainer 'nope'"):
        TRAINERS.get("nope")
