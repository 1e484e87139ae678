import itertools

import numpy as np
import pytest

from tierlink.errors import ModelError
from tierlink.models.evaluate import (
    CASCADE_THRESHOLDS,
    accuracy,
    cascade_curve,
    latency,
    softmax,
)


def test_softmax_rows_sum_to_one_and_temperature_flattens():
    logits = np.array([[2.0, 0.0, 0.0], [1000.0, 0.0, -1000.0]])
    probs = softmax(logits)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert softmax(logits, temperature=10.0)[0, 0] < probs[0, 0]


def test_accuracy_counts_top1_and_rejects_empty():
    logits = np.eye(4)
    assert accuracy(logits, np.array([0, 1, 2, 0])) == 0.75
    with pytest.raises(ModelError):
        accuracy(np.zeros((0, 4)), np.zeros(0, np.int64))


def test_cascade_curve_answers_confident_inputs():
    # Confidences 0.99 (right), 0.9 (right), 0.6 (wrong), ~0.34 (wrong).
    probs = np.array([[0.99, 0.01], [0.9, 0.1], [0.4, 0.6], [0.34, 0.66]])
    labels = np.array([0, 0, 0, 0])
    curve = cascade_curve(np.log(probs), labels, thresholds=(0.5, 0.95, 0.995))
    assert [p.threshold for p in curve] == [0.5, 0.95, 0.995]
    assert curve[0].answered_share == 1.0 and curve[0].answered_accuracy == 0.5
    assert curve[1].answered_share == 0.25 and curve[1].answered_accuracy == 1.0
    # Nobody answered: share 0, accuracy vacuously 1.
    assert curve[2].answered_share == 0.0 and curve[2].answered_accuracy == 1.0


def test_default_thresholds_are_the_documented_grid():
    assert CASCADE_THRESHOLDS[0] == 0.5 and CASCADE_THRESHOLDS[-1] == 0.99
    assert len(CASCADE_THRESHOLDS) == 13 and list(CASCADE_THRESHOLDS) == sorted(CASCADE_THRESHOLDS)


class FakeSession:
    """An ONNX Runtime session stand-in that records batch sizes."""

    class _Input:
        name = "input"

    def __init__(self):
        self.batches = []

    def get_inputs(self):
        return [self._Input()]

    def get_outputs(self):
        return [self._Input()]

    def run(self, outputs, feeds):
        self.batches.append(len(feeds["input"]))
        return [np.zeros((len(feeds["input"]), 10), np.float32)]


def test_latency_by_count_uses_the_injected_clock():
    ticks = itertools.count(step=0.002)  # every call to the clock advances 2 ms
    session = FakeSession()
    timed = latency(session, np.zeros((40, 1, 28, 28), np.float32), runs=10,
                    warmup=3, clock=lambda: next(ticks))
    assert timed == pytest.approx({"batch1_p50": 2.0, "batch1_p95": 2.0,
                                     "batch32_per_sample": 2.0 / 32})
    assert session.batches.count(1) == 13 and session.batches.count(32) == 10
    with pytest.raises(ModelError):
        latency(session, np.zeros((0, 1, 28, 28), np.float32))
