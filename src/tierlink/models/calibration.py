"""Calibrated confidence: temperature scaling (Guo et al., 2017) and its measures.

A classifier's max softmax probability is the confidence a cascade thresholds on; trained
nets are usually over-confident, so a single temperature ``T`` is fitted on the held-out
calibration split by minimising the negative log-likelihood of ``softmax(logits / T)``.
``T`` never changes the predicted class, only how sure the model says it is. Any output
kind with logits is fitted the same way (:func:`kind_temperature`: on the likelihood the
kind itself defines, :meth:`~tierlink.models.kinds.OutputKind.nll` — a softmax NLL, a
sigmoid's binary cross-entropy for multilabel outputs, a user's kind its own). Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from tierlink.errors import ModelError
from tierlink.models.card import Calibration, ModelCard

if TYPE_CHECKING:
    from tierlink.models.kinds import OutputKind
    from tierlink.models.task import TaskSpec

ECE_BINS = 15
T_MIN, T_MAX = 0.05, 20.0


def log_softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise log-softmax of ``logits / temperature`` (N, C), in float64."""
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the true labels under ``softmax(logits / T)``."""
    _check(logits, labels)
    logp = log_softmax(logits, temperature)
    return float(-logp[np.arange(len(labels)), labels].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray, *, tol: float = 1e-4) -> float:
    """The temperature in [T_MIN, T_MAX] minimising the NLL on (``logits``, ``labels``).

    The NLL is convex in 1/T, so a golden-section search over log T finds the optimum;
    ``tol`` is the width of the final bracket in log T.
    """
    _check(logits, labels)
    return best_temperature(lambda t: nll(logits, labels, t), tol=tol)


def best_temperature(loss: Callable[[float], float], *, tol: float = 1e-4) -> float:
    """The temperature in [T_MIN, T_MAX] minimising ``loss(T)`` (convex in 1/T, as an NLL
    is): a golden-section search over log T; ``tol`` is the final bracket's width in log T."""
    lo, hi = math.log(T_MIN), math.log(T_MAX)
    ratio = (math.sqrt(5) - 1) / 2

    def at(log_t: float) -> float:
        return loss(math.exp(log_t))

    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = at(a), at(b)
    while hi - lo > tol:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = at(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = at(b)
    return float(math.exp((lo + hi) / 2))


@dataclass(frozen=True, slots=True)
class Reliability:
    """Per confidence bin: its bounds, how many samples fell in it, their mean confidence
    and their accuracy (both 0 for an empty bin). ``ece``: the count-weighted mean
    |accuracy - confidence| over the bins."""

    edges: np.ndarray       # (B + 1,)
    counts: np.ndarray      # (B,)
    confidence: np.ndarray  # (B,)
    accuracy: np.ndarray    # (B,)
    ece: float


def reliability(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0,
                bins: int = ECE_BINS) -> Reliability:
    """Reliability table of ``softmax(logits / T)`` in ``bins`` equal-width bins."""
    _check(logits, labels)
    probs = np.exp(log_softmax(logits, temperature))
    return reliability_of(probs.max(axis=1), probs.argmax(axis=1) == labels, bins)


def reliability_of(confidence: np.ndarray, correct: np.ndarray,
                   bins: int = ECE_BINS) -> Reliability:
    """Reliability table of any output kind's per-sample ``confidence`` and ``correct``."""
    correct = np.asarray(correct, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    # Bin i holds (edges[i], edges[i+1]]; a confidence of 0 falls in the first bin.
    index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
    counts = np.bincount(index, minlength=bins).astype(np.float64)
    safe = np.maximum(counts, 1)
    mean_conf = np.bincount(index, weights=confidence, minlength=bins) / safe
    mean_acc = np.bincount(index, weights=correct, minlength=bins) / safe
    ece = float((counts * np.abs(mean_acc - mean_conf)).sum() / max(1, len(confidence)))
    return Reliability(edges, counts.astype(np.int64), mean_conf, mean_acc, ece)


def ece(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0,
        bins: int = ECE_BINS) -> float:
    """Expected calibration error of ``softmax(logits / T)`` (0 = perfectly calibrated)."""
    return reliability(logits, labels, temperature, bins).ece


def calibration_error(confidence: np.ndarray, correct: np.ndarray,
                      bins: int = ECE_BINS) -> float:
    """Expected calibration error of any output kind's confidence (:func:`ece` for logits)."""
    return reliability_of(confidence, correct, bins).ece


def kind_temperature(kind: OutputKind, raw: Mapping[str, np.ndarray], y: np.ndarray,
                     task: TaskSpec) -> tuple[float, float, float]:
    """(temperature, NLL before, NLL after) of a model of ``task`` on its calibration data:
    :func:`best_temperature` on the kind's likelihood; 1.0 (and NaNs) where the kind fits
    none."""
    logits = kind.logits(raw, task) if kind.temperature_fit else None
    if logits is None:
        return 1.0, math.nan, math.nan
    labels = np.asarray(y)

    def loss(t: float) -> float:
        return kind.nll(logits, labels, task, t)
    t = best_temperature(loss)
    return t, loss(1.0), loss(t)


def _check(logits: np.ndarray, labels: np.ndarray) -> None:
    if logits.ndim != 2 or labels.ndim != 1 or len(logits) != len(labels):
        raise ModelError(f"calibration needs logits (N, C) and labels (N,), got "
                       f"{logits.shape} and {labels.shape}")
    if len(labels) == 0:
        raise ModelError("calibration needs at least one sample")


def calibrated_card(card: ModelCard, calib_logits: np.ndarray, calib_labels: np.ndarray,
                    test_logits: np.ndarray, test_labels: np.ndarray,
                    thresholds: tuple[float, ...] | None = None) -> ModelCard:
    """``card`` with a temperature fitted on the calibration split, the before/after
    measures, and its cascade curve recomputed on calibrated confidence. The test split
    only measures how well the fit holds (``test_ece_*``); it never influences ``T``.
    ``thresholds``: where the curve is read (by default the zoo's)."""
    from tierlink.models.evaluate import CASCADE_THRESHOLDS, cascade_curve

    calibration = measure_calibration(calib_logits, calib_labels, test_logits, test_labels)
    t = calibration.temperature
    return replace(card, temperature=t, calibration=calibration,
                   cascade=cascade_curve(calib_logits, calib_labels,
                                         thresholds or CASCADE_THRESHOLDS, temperature=t))


def measure_calibration(calib_logits: np.ndarray, calib_labels: np.ndarray,
                        test_logits: np.ndarray, test_labels: np.ndarray) -> Calibration:
    """A temperature fitted on the calibration split (rounded to 5 decimals, as cards keep
    it) and ECE/NLL before and after it; the test split only checks how well it holds."""
    t = round(fit_temperature(calib_logits, calib_labels), 5)
    return Calibration(
        temperature=t,
        ece_before=round(ece(calib_logits, calib_labels), 5),
        ece_after=round(ece(calib_logits, calib_labels, t), 5),
        nll_before=round(nll(calib_logits, calib_labels), 5),
        nll_after=round(nll(calib_logits, calib_labels, t), 5),
        test_ece_before=round(ece(test_logits, test_labels), 5),
        test_ece_after=round(ece(test_logits, test_labels, t), 5),
        samples=len(calib_labels))
