"""Staged rollouts of a model version with health gates. Pure: no I/O, no clock, no threads.

* :mod:`~tierlink.rollout.stats`: the per-version counters nodes report
  (:class:`VersionStats`), windows over them, p95 from buckets, :func:`psi`;
* :mod:`~tierlink.rollout.gates`: :class:`Gates` thresholds and their :class:`Verdict` s;
* :mod:`~tierlink.rollout.traffic`: per-node :class:`Assignment` s (version, weight) that put
  a stage's share of the tier's traffic on the new version;
* :mod:`~tierlink.rollout.machine`: :class:`RolloutSpec`, :class:`RolloutState`,
  :func:`step` and the operator actions.

The control plane owns the I/O: it builds a :class:`FleetSnapshot` from heartbeats, calls
:func:`step`, stores the state, publishes the assignments.
"""

from tierlink.rollout.gates import Baseline, Gates, Outcome, Verdict
from tierlink.rollout.machine import (
    Decision,
    FleetSnapshot,
    NodeSnapshot,
    Phase,
    RolloutSpec,
    RolloutState,
    Transition,
    assignments_for,
    check_cohort,
    converged,
    default_stages,
    describe,
    in_cohort,
    pause,
    promote,
    resume,
    rollback,
    step,
)
from tierlink.rollout.stats import CONFIDENCE_BINS, LATENCY_BUCKETS_MS, VersionStats, psi
from tierlink.rollout.traffic import Assignment, assign, canary_order, expected_share

__all__ = [
    "CONFIDENCE_BINS", "LATENCY_BUCKETS_MS", "Assignment", "Baseline", "Decision",
    "FleetSnapshot", "Gates", "NodeSnapshot", "Outcome", "Phase", "RolloutSpec",
    "RolloutState", "Transition", "Verdict", "VersionStats", "assign", "assignments_for",
    "canary_order", "check_cohort", "converged", "default_stages", "describe",
    "expected_share", "in_cohort", "pause", "promote", "psi", "resume", "rollback", "step",
]
