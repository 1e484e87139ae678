"""The rollout state machine: pure, clock-injected (``FleetSnapshot.now``), no I/O.

Phases (``Phase``)::

    pending -> deploying(1) -> soaking(1) -> deploying(2) -> ... -> soaking(last) -> promoted
                   |  install failure,          |  a gate fails, install failure,
                   |  not active in time        |  insufficient data + policy "rollback"
                   +-------------> rolled_back <+
    deploying / soaking <-> paused   (operator; or insufficient data with policy "hold")
    pending -> failed                (no node of the tier in the fleet)

* **deploying(k)**: the stage's :class:`~tierlink.rollout.traffic.Assignment` s are out;
  the machine waits until every node given the new version reports holding it (active for
  weight 1, standby at that weight otherwise). Not within ``deploy_timeout_s`` → rollback.
* **soaking(k)**: the stats window starts (counters of the new and previous versions on
  every node of the tier are kept in the state). Each step evaluates every gate on the
  window: the new version on the stage's nodes against the previous version on all nodes
  of the tier (the canary nodes' remaining share included); where that is too little (every
  node moved), against the previous version *before this stage* (``reference``: the
  previous stage's baseline window, or for the first stage everything the previous version
  served before it). A failing gate rolls back at once (``fail_fast``, default) or at the
  end of the soak; after ``soak_s`` with enough data (``min_requests`` on both sides) and
  no failure the rollout moves to the next stage, or is promoted after the last one. Too
  little data, or a gate ``suspect`` (past its threshold, not yet significant): soak on up
  to ``max_soak_s`` (default 3 x ``soak_s``), then apply ``insufficient_data`` — ``hold``
  (default: pause and say so), ``promote`` or ``rollback``.
* In any live phase (paused too), an install failure of the new version reported by a node
  the rollout asked to hold it (it crashed on load, failed verification) rolls back at
  once, naming node and error.

Contract: the control plane calls :func:`step` about once per heartbeat round with the
current :class:`FleetSnapshot` (``now`` is *its* clock reading; the nodes of the tier that
serve the model, with failures only of attempts made for this rollout), persists
``decision.state`` (``to_dict``), logs and counts ``decision.transitions``, and publishes
``decision.assignments`` to the nodes — also in terminal phases (they keep saying "all on
the previous version" after a rollback until :func:`converged`). Operator actions
(:func:`pause`, :func:`resume`, :func:`promote`, :func:`rollback`) are pure functions of the
state too; they raise :class:`~tierlink.errors.RolloutError` when the action does not apply.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from tierlink.core.types import Tier
from tierlink.errors import ConfigError, RolloutError
from tierlink.rollout.gates import Baseline, Gates, Outcome, Verdict, enough_data, evaluate
from tierlink.rollout.stats import VersionStats
from tierlink.rollout.traffic import Assignment, all_on, assign, expected_share

__all__ = ["Decision", "FleetSnapshot", "Gates", "NodeSnapshot", "Phase", "RolloutSpec",
           "RolloutState", "Transition", "assignments_for", "converged", "default_stages",
           "describe", "pause", "promote", "resume", "rollback", "step"]

INSUFFICIENT_POLICIES = ("hold", "promote", "rollback")
DEFAULT_STAGES: tuple[float, ...] = (0.1, 0.5, 1.0)
_SPEC_HINT = ("a rollout spec: name, version, previous, tier, stages (increasing shares in "
              "(0, 1], the last 1.0), soak_s, gates, min_requests, deploy_timeout_s, "
              "max_soak_s, insufficient_data (hold|promote|rollback), fail_fast")
_STATE_HINT = "the stored rollout state is damaged; roll back by hand and start again"
_MAX_MOVES = 8  # transitions one step may chain (pending -> deploying -> soaking -> ...)


class Phase(str, Enum):
    PENDING = "pending"
    DEPLOYING = "deploying"
    SOAKING = "soaking"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.FAILED)


def default_stages(canary: float) -> tuple[float, ...]:
    """The stages for ``--canary``: the canary share, then 50% if that is still far, then all."""
    if not 0 < canary <= 1:
        raise ConfigError(f"canary must be a share in (0, 1], got {canary}",
                          hint="e.g. --canary 10%")
    return (canary, 0.5, 1.0) if canary < 0.5 else (canary, 1.0) if canary < 1 else (1.0,)


# -- spec ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """What to roll out where, and how carefully. Validated on construction.

    ``stages``: shares of the tier's traffic, increasing, ending at 1.0. ``soak_s``: how long
    each stage runs before it may pass. ``min_requests``: requests needed on each side of a
    comparison. ``deploy_timeout_s``: how long a stage's nodes may take to report the version.
    ``max_soak_s``: the longest a stage soaks waiting for data (None: 3 x ``soak_s``).
    ``fail_fast``: roll back as soon as a gate fails, not only at the end of the soak.
    ``selector``: labels a node must carry to be in this rollout (a cohort: a site, a
    hardware class; empty: the whole tier). ``cohorts``: the selectors of the cohorts that
    follow, one after another, each a rollout of its own with its own gates, started once
    this one is promoted (a cohort that fails rolls back alone and the ones after it do not
    start)."""

    name: str
    version: str
    previous: str
    tier: Tier
    stages: tuple[float, ...] = DEFAULT_STAGES
    soak_s: float = 60.0
    gates: Gates = field(default_factory=Gates)
    min_requests: int = 100
    deploy_timeout_s: float = 120.0
    max_soak_s: float | None = None
    insufficient_data: str = "hold"
    fail_fast: bool = True
    selector: Mapping[str, str] = field(default_factory=dict)
    cohorts: tuple[Mapping[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("name", "version", "previous"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"rollout {name} must be a non-empty string", hint=_SPEC_HINT)
        if self.version == self.previous:
            raise ConfigError(f"rollout version {self.version!r} is already the previous one",
                              hint="roll out a different version")
        _check_stages(self.stages)
        _check_durations(self)
        for selector in (self.selector, *self.cohorts):
            check_cohort(selector)
        if self.insufficient_data not in INSUFFICIENT_POLICIES:
            raise ConfigError(f"insufficient_data must be one of "
                              f"{', '.join(INSUFFICIENT_POLICIES)}, got "
                              f"{self.insufficient_data!r}", hint=_SPEC_HINT)

    @property
    def soak_limit_s(self) -> float:
        return self.max_soak_s if self.max_soak_s is not None else 3.0 * self.soak_s

    def stage_label(self, stage: int) -> str:
        return f"stage {stage + 1}/{len(self.stages)} ({self.stages[stage]:.0%})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "previous": self.previous,
                "tier": self.tier.label, "stages": list(self.stages), "soak_s": self.soak_s,
                "gates": self.gates.to_dict(), "min_requests": self.min_requests,
                "deploy_timeout_s": self.deploy_timeout_s, "max_soak_s": self.max_soak_s,
                "insufficient_data": self.insufficient_data, "fail_fast": self.fail_fast,
                "selector": dict(sorted(self.selector.items())),
                "cohorts": [dict(sorted(c.items())) for c in self.cohorts]}

    @property
    def cohort_key(self) -> str:
        """The cohort as text (``hw=jetson,site=lab``; "" for the whole tier)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutSpec:
        """Decode (and validate) a spec; ``ConfigError`` names the bad field."""
        if not isinstance(data, Mapping):
            raise ConfigError("a rollout spec must be an object", hint=_SPEC_HINT)
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        missing = [k for k in ("name", "version", "previous", "tier") if k not in data]
        if unknown or missing:
            raise ConfigError(f"rollout spec: unknown field(s) {unknown}, missing {missing}",
                              hint=_SPEC_HINT)
        kwargs = dict(data)
        try:
            kwargs["tier"] = Tier.parse(data["tier"])
            kwargs["stages"] = tuple(float(s) for s in data.get("stages", DEFAULT_STAGES))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"rollout spec: {exc}", hint=_SPEC_HINT) from exc
        kwargs["version"], kwargs["previous"] = str(data["version"]), str(data["previous"])
        kwargs["gates"] = Gates.from_dict(data.get("gates") or {})
        kwargs["selector"] = dict(data.get("selector") or {})
        cohorts = data.get("cohorts") or ()
        if not isinstance(cohorts, list | tuple):
            raise ConfigError(f"rollout cohorts must be a list of label mappings, got "
                              f"{cohorts!r}", hint='e.g. [{"hw": "a"}, {"hw": "b"}]')
        kwargs["cohorts"] = tuple(dict(c) if isinstance(c, Mapping) else c for c in cohorts)
        return cls(**kwargs)


def check_cohort(selector: Any) -> Mapping[str, str]:
    """``selector`` if it is a cohort (a mapping of label to value); ``ConfigError`` if not."""
    if not isinstance(selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in selector.items()):
        raise ConfigError(f"a rollout cohort is a mapping of label to value, got "
                          f"{selector!r}", hint='e.g. {"hw": "jetson"}')
    return selector


def in_cohort(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Does a node with ``labels`` belong to the cohort ``selector`` names ({}: all do)?"""
    return all(labels.get(k) == v for k, v in selector.items())


def _check_stages(stages: tuple[float, ...]) -> None:
    ok = (isinstance(stages, tuple) and len(stages) > 0
          and all(isinstance(s, float | int) and 0 < s <= 1 for s in stages)
          and all(a < b for a, b in itertools.pairwise(stages))
          and stages[-1] == 1.0)
    if not ok:
        raise ConfigError(f"rollout stages must be increasing shares in (0, 1] ending at 1.0, "
                          f"got {stages!r}", hint="e.g. stages: [0.1, 0.5, 1.0]")


def _check_durations(spec: RolloutSpec) -> None:
    checks = [("soak_s", spec.soak_s, 0.0), ("deploy_timeout_s", spec.deploy_timeout_s, 1e-9),
              ("min_requests", spec.min_requests, 1)]
    if spec.max_soak_s is not None:
        checks.append(("max_soak_s", spec.max_soak_s, spec.soak_s))
    for name, value, low in checks:
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value < low:
            raise ConfigError(f"rollout {name} must be a number >= {low:g}, got {value!r}",
                              hint=_SPEC_HINT)
    if not isinstance(spec.min_requests, int):
        raise ConfigError("rollout min_requests must be an integer", hint=_SPEC_HINT)


# -- fleet snapshot -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """What the control plane knows about one node *for the rollout's model*, from its
    last heartbeat: the versions in its active and standby slots, ``standby_weight`` (the
    share of requests its standby version serves now; None when the node does not say, and
    then the slots alone decide), per-version stats (cumulative, see
    :mod:`tierlink.rollout.stats`) and install failures (version -> error message, e.g. it
    crashed on load or failed verification)."""

    node_id: str
    tier: Tier
    active_version: str | None = None
    standby_version: str | None = None
    stats: Mapping[str, VersionStats] = field(default_factory=dict)
    install_failures: Mapping[str, str] = field(default_factory=dict)
    standby_weight: float | None = None

    def holds(self, assignment: Assignment) -> bool:
        """Whether the node serves as ``assignment`` asks (as far as it reports)."""
        if assignment.weight >= 1.0:
            standby_idle = (self.standby_weight is None or self.standby_weight <= 0.0
                            or self.standby_version == assignment.version)
            return self.active_version == assignment.version and standby_idle
        weight_ok = (self.standby_weight is None
                     or abs(self.standby_weight - assignment.weight) <= 1e-6)
        return self.standby_version == assignment.version and weight_ok

    def describe(self) -> str:
        weight = "" if self.standby_weight is None else f" at {self.standby_weight:.2f}"
        return (f"{self.node_id} reports active {self.active_version or 'none'}, standby "
                f"{self.standby_version or 'none'}{weight}")


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The fleet at ``now`` (the control plane's clock): every live node it knows."""

    now: float
    nodes: tuple[NodeSnapshot, ...]

    def __post_init__(self) -> None:
        ids = [n.node_id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ConfigError("fleet snapshot lists a node twice",
                              hint="build one NodeSnapshot per node id")

    def tier_nodes(self, tier: Tier) -> list[NodeSnapshot]:
        """The nodes of ``tier``, sorted by id."""
        return sorted((n for n in self.nodes if n.tier == tier), key=lambda n: n.node_id)


# -- state --------------------------------------------------------------------------------

Window = Mapping[str, Mapping[str, VersionStats]]  # node id -> version -> cumulative stats


@dataclass(frozen=True, slots=True)
class Transition:
    """One phase change: when, from and to which phase, at which stage index (after the
    change), why, and the gate ``verdicts`` it rests on (empty when it does not rest on
    gates: operator actions, timeouts, install failures)."""

    at: float
    from_phase: Phase
    to_phase: Phase
    stage: int
    reason: str
    verdicts: tuple[Verdict, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "from_phase": self.from_phase.value,
                "to_phase": self.to_phase.value, "stage": self.stage, "reason": self.reason,
                "verdicts": [v.to_dict() for v in self.verdicts]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Transition:
        return cls(float(data["at"]), Phase(data["from_phase"]), Phase(data["to_phase"]),
                   int(data["stage"]), str(data["reason"]),
                   tuple(Verdict.from_dict(v) for v in data.get("verdicts", ())))


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Where a rollout is. ``stage``: index into ``spec.stages``; ``stage_started_at``:
    when its assignments went out; ``phase_started_at``: when the phase began (the soak's
    start while soaking); ``window_start``: counters at the soak's start (None until the
    stage is active); ``reference``: the previous version before this stage (fallback
    baseline); ``paused_from``: the phase a pause interrupted; ``verdicts``: the last gate
    evaluation; ``history``: every transition so far."""

    phase: Phase = Phase.PENDING
    stage: int = 0
    created_at: float = 0.0
    stage_started_at: float = 0.0
    phase_started_at: float = 0.0
    window_start: Window | None = None
    reference: VersionStats | None = None
    paused_from: Phase | None = None
    verdicts: tuple[Verdict, ...] = ()
    history: tuple[Transition, ...] = ()

    @classmethod
    def start(cls, now: float) -> RolloutState:
        """A new rollout, pending at ``now``."""
        return cls(created_at=now, stage_started_at=now, phase_started_at=now)

    @property
    def terminal(self) -> bool:
        return self.phase.terminal

    @property
    def reason(self) -> str:
        """Why the rollout is where it is (the last transition's reason)."""
        return self.history[-1].reason if self.history else "created"

    def to_dict(self) -> dict[str, Any]:
        window = None if self.window_start is None else {
            node: {v: s.to_dict() for v, s in per.items()}
            for node, per in self.window_start.items()}
        return {"phase": self.phase.value, "stage": self.stage, "created_at": self.created_at,
                "stage_started_at": self.stage_started_at,
                "phase_started_at": self.phase_started_at, "window_start": window,
                "reference": None if self.reference is None else self.reference.to_dict(),
                "paused_from": None if self.paused_from is None else self.paused_from.value,
                "verdicts": [v.to_dict() for v in self.verdicts],
                "history": [t.to_dict() for t in self.history]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutState:
        """Decode a stored state; ``ConfigError`` if it is damaged."""
        try:
            return _state_from_dict(data)
        except ConfigError:
            raise
        except Exception as exc:  # KeyError, TypeError, ValueError, InvalidRequest
            raise ConfigError(f"rollout state is malformed: {exc!r}", hint=_STATE_HINT) \
                from exc


def _state_from_dict(data: Mapping[str, Any]) -> RolloutState:
    raw_window = data.get("window_start")
    window = None if raw_window is None else {
        str(node): {str(v): VersionStats.from_dict(s) for v, s in per.items()}
        for node, per in raw_window.items()}
    reference = data.get("reference")
    paused_from = data.get("paused_from")
    return RolloutState(
        phase=Phase(data["phase"]), stage=int(data["stage"]),
        created_at=float(data["created_at"]), stage_started_at=float(data["stage_started_at"]),
        phase_started_at=float(data["phase_started_at"]), window_start=window,
        reference=None if reference is None else VersionStats.from_dict(reference),
        paused_from=None if paused_from is None else Phase(paused_from),
        verdicts=tuple(Verdict.from_dict(v) for v in data.get("verdicts", ())),
        history=tuple(Transition.from_dict(t) for t in data.get("history", ())))


@dataclass(frozen=True, slots=True)
class Decision:
    """The result of one :func:`step`: the next ``state``, the ``transitions`` this step made
    (already appended to ``state.history``), what every node of the tier should serve, the
    expected share of the tier's traffic on the new version under those assignments, and the
    gate ``verdicts`` evaluated in this step (empty when none were)."""

    state: RolloutState
    transitions: tuple[Transition, ...]
    assignments: tuple[Assignment, ...]
    share: float
    verdicts: tuple[Verdict, ...]


def describe(spec: RolloutSpec, state: RolloutState, now: float) -> str:
    """One line for ``tierlink rollout status``: what, where, how far, and why."""
    what = f"{spec.name} {spec.previous} -> {spec.version} on {spec.tier.label}"
    since = f"{now - state.phase_started_at:.0f} s"
    if state.phase is Phase.SOAKING:
        where = f"{spec.stage_label(state.stage)} soaking {since} of {spec.soak_s:g} s"
    elif state.phase in (Phase.DEPLOYING, Phase.PAUSED):
        where = f"{spec.stage_label(state.stage)} {state.phase.value} for {since}"
    else:
        where = f"{state.phase.value} {since} ago" if state.history else state.phase.value
    return f"{what}: {where} — {state.reason}"


# -- step ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Move:
    state: RolloutState
    transition: Transition | None = None
    verdicts: tuple[Verdict, ...] = ()


def step(spec: RolloutSpec, state: RolloutState, fleet: FleetSnapshot) -> Decision:
    """Advance the rollout as far as ``fleet`` allows at ``fleet.now`` (see module doc)."""
    transitions: list[Transition] = []
    verdicts: tuple[Verdict, ...] = ()
    for _ in range(_MAX_MOVES):
        move = _advance(spec, state, fleet)
        state, verdicts = move.state, move.verdicts or verdicts
        if move.transition is None:
            break
        transitions.append(move.transition)
    assignments = assignments_for(spec, state, fleet)
    return Decision(state, tuple(transitions), assignments,
                    expected_share(assignments, spec.version), verdicts)


def assignments_for(spec: RolloutSpec, state: RolloutState,
                    fleet: FleetSnapshot) -> tuple[Assignment, ...]:
    """What every node of the tier should serve in ``state``."""
    ids = [n.node_id for n in fleet.tier_nodes(spec.tier)]
    phase = state.paused_from if state.phase is Phase.PAUSED else state.phase
    if phase in (Phase.DEPLOYING, Phase.SOAKING):
        return assign(spec.name, spec.version, spec.previous, spec.stages[state.stage], ids)
    if phase is Phase.PROMOTED:
        return all_on(spec.version, ids)
    return all_on(spec.previous, ids)


def converged(assignments: Iterable[Assignment], fleet: FleetSnapshot) -> bool:
    """Whether every assigned node reports serving as assigned (e.g. a rollback is done)."""
    nodes = {n.node_id: n for n in fleet.nodes}
    return all(a.node_id in nodes and nodes[a.node_id].holds(a) for a in assignments)


def _advance(spec: RolloutSpec, state: RolloutState, fleet: FleetSnapshot) -> _Move:
    if state.terminal:
        return _Move(state)
    failure = _install_failure(spec, state, fleet)
    if failure:
        return _to(state, fleet.now, Phase.ROLLED_BACK, failure, paused_from=None)
    handlers: dict[Phase, Callable[[RolloutSpec, RolloutState, FleetSnapshot], _Move]] = {
        Phase.PENDING: _on_pending, Phase.DEPLOYING: _on_deploying,
        Phase.SOAKING: _on_soaking}
    handler = handlers.get(state.phase)
    return handler(spec, state, fleet) if handler else _Move(state)  # paused: hold


def _to(state: RolloutState, now: float, phase: Phase, reason: str,
        evidence: Sequence[Verdict] = (), **changes: Any) -> _Move:
    """Move ``state`` to ``phase`` at ``now`` with ``reason``, the gate verdicts it rests on
    (``evidence``) and field ``changes``."""
    stage = changes.get("stage", state.stage)
    transition = Transition(now, state.phase, phase, stage, reason, tuple(evidence))
    moved = replace(state, phase=phase, phase_started_at=now,
                    history=state.history + (transition,), **changes)
    return _Move(moved, transition, tuple(evidence))


def _install_failure(spec: RolloutSpec, state: RolloutState, fleet: FleetSnapshot) -> str:
    """Why the new version cannot run, from install failures reported by the nodes the
    rollout asked to hold it (none while pending); '' if none."""
    asked = {a.node_id for a in assignments_for(spec, state, fleet)
             if a.version == spec.version}
    failed = [f"{n.node_id}: {n.install_failures[spec.version]}"
              for n in fleet.tier_nodes(spec.tier)
              if n.node_id in asked and spec.version in n.install_failures]
    if not failed:
        return ""
    return f"{spec.name} {spec.version} failed to install on " + "; ".join(failed)


def _on_pending(spec: RolloutSpec, state: RolloutState, fleet: FleetSnapshot) -> _Move:
    if not fleet.tier_nodes(spec.tier):
        return _to(state, fleet.now, Phase.FAILED,
                   f"no {spec.tier.label} nodes in the fleet to roll {spec.name} out to")
    return _start_stage(spec, state, fleet.now, 0, fleet)


def _start_stage(spec: RolloutSpec, state: RolloutState, now: float, stage: int,
                 fleet: FleetSnapshot | None = None, why: str = "",
                 evidence: Sequence[Verdict] = ()) -> _Move:
    """Send out ``stage``'s assignments (described when the fleet is known)."""
    where = ""
    if fleet is not None:
        ids = [n.node_id for n in fleet.tier_nodes(spec.tier)]
        moved = [a for a in assign(spec.name, spec.version, spec.previous, spec.stages[stage],
                                   ids) if a.version == spec.version]
        where = ": " + ", ".join(f"{a.node_id} at weight {a.weight:.2f}" for a in moved)
    reason = (f"{why}{spec.stage_label(stage)}: {spec.stages[stage]:.0%} of "
              f"{spec.tier.label} traffic to {spec.name} {spec.version}{where}")
    return _to(state, now, Phase.DEPLOYING, reason, evidence, stage=stage,
               stage_started_at=now, window_start=None, paused_from=None, verdicts=())


def _on_deploying(spec: RolloutSpec, state: RolloutState, fleet: FleetSnapshot) -> _Move:
    nodes = {n.node_id: n for n in fleet.tier_nodes(spec.tier)}
    waiting = [nodes[a.node_id] for a in assignments_for(spec, state, fleet)
               if a.version == spec.version and not nodes[a.node_id].holds(a)]
    label = spec.stage_label(state.stage)
    if not waiting:
        window = _capture(spec, fleet)
        reference = state.reference or _previous_total(spec, fleet)
        return _to(state, fleet.now, Phase.SOAKING,
                   f"{label} active; soaking {spec.soak_s:g} s", window_start=window,
                   reference=reference if reference.requests else None)
    waited = fleet.now - state.stage_started_at
    if waited >= spec.deploy_timeout_s:
        return _to(state, fleet.now, Phase.ROLLED_BACK,
                   f"{label} not active within {spec.deploy_timeout_s:g} s: "
                   + "; ".join(n.describe() for n in waiting))
    return _Move(state)


def _capture(spec: RolloutSpec, fleet: FleetSnapshot) -> dict[str, dict[str, VersionStats]]:
    """The counters of the new and previous versions on every node of the tier, now."""
    return {n.node_id: {v: n.stats[v] for v in (spec.version, spec.previous) if v in n.stats}
            for n in fleet.tier_nodes(spec.tier)}


def _previous_total(spec: RolloutSpec, fleet: FleetSnapshot) -> VersionStats:
    return VersionStats.total(n.stats[spec.previous] for n in fleet.tier_nodes(spec.tier)
                              if spec.previous in n.stats)


def _windows(spec: RolloutSpec, state: RolloutState,
             fleet: FleetSnapshot) -> tuple[VersionStats, list[Baseline]]:
    """The new version's window on the stage's nodes and the baselines to compare with."""
    start = state.window_start or {}
    staged = {a.node_id for a in assignments_for(spec, state, fleet)
              if a.version == spec.version}

    def window(node: NodeSnapshot, version: str) -> VersionStats | None:
        if version not in node.stats:
            return None
        return node.stats[version].minus(start.get(node.node_id, {}).get(version))

    tier = fleet.tier_nodes(spec.tier)
    new = VersionStats.total(w for n in tier if n.node_id in staged
                             for w in [window(n, spec.version)] if w is not None)
    same = VersionStats.total(w for n in tier for w in [window(n, spec.previous)]
                              if w is not None)
    baselines = [Baseline(same)]
    if state.reference is not None:
        baselines.append(Baseline(state.reference, f"vs {spec.previous} before this stage"))
    return new, baselines


def _on_soaking(spec: RolloutSpec, state: RolloutState, fleet: FleetSnapshot) -> _Move:
    new, baselines = _windows(spec, state, fleet)
    verdicts = evaluate(spec.gates, spec.min_requests, new, baselines)
    elapsed = fleet.now - state.phase_started_at
    failed = [v for v in verdicts if v.outcome is Outcome.FAIL]
    label = spec.stage_label(state.stage)
    if failed and (spec.fail_fast or elapsed >= spec.soak_s):
        return _to(state, fleet.now, Phase.ROLLED_BACK,
                   f"{label}: " + "; ".join(v.reason for v in failed), verdicts,
                   verdicts=verdicts)
    if elapsed < spec.soak_s:
        return _Move(replace(state, verdicts=verdicts), None, verdicts)
    suspect = [v for v in verdicts if v.outcome is Outcome.SUSPECT]
    enough = enough_data(spec.min_requests, new, baselines)
    if enough and not suspect:
        return _pass_stage(spec, state, fleet, verdicts, baselines[0].stats)
    if elapsed < spec.soak_limit_s:
        return _Move(replace(state, verdicts=verdicts), None, verdicts)
    shortage = ("; ".join(v.reason for v in suspect) if enough
                else _shortage(spec, new, baselines))
    return _insufficient(spec, state, fleet, verdicts, f"after {elapsed:.0f} s, {shortage}")


def _pass_stage(spec: RolloutSpec, state: RolloutState, fleet: FleetSnapshot,
                verdicts: Sequence[Verdict], same_window: VersionStats) -> _Move:
    """The stage passed: keep its baseline as the next reference, move on."""
    skipped = [v.gate for v in verdicts if v.outcome is Outcome.INSUFFICIENT]
    note = f" (insufficient data, not judged: {', '.join(skipped)})" if skipped else ""
    why = f"{spec.stage_label(state.stage)} passed every gate{note}"
    if same_window.requests >= spec.min_requests:
        state = replace(state, reference=same_window)
    return _next_stage(spec, replace(state, verdicts=tuple(verdicts)), fleet.now, why, fleet,
                       verdicts)


def _next_stage(spec: RolloutSpec, state: RolloutState, now: float, why: str,
                fleet: FleetSnapshot | None = None,
                evidence: Sequence[Verdict] = ()) -> _Move:
    stage = 0 if state.phase is Phase.PENDING or (
        state.phase is Phase.PAUSED and state.paused_from is Phase.PENDING) else state.stage + 1
    if stage >= len(spec.stages):
        return _to(state, now, Phase.PROMOTED,
                   f"{why}; all {spec.tier.label} traffic on {spec.name} {spec.version}",
                   evidence, paused_from=None)
    return _start_stage(spec, state, now, stage, fleet, f"{why}; " if why else "", evidence)


def _shortage(spec: RolloutSpec, new: VersionStats, baselines: Sequence[Baseline]) -> str:
    base = max(b.stats.requests for b in baselines)
    return (f"insufficient data: {new.requests} requests on {spec.version} and {base} on "
            f"{spec.previous} (need {spec.min_requests} each)")


def _insufficient(spec: RolloutSpec, state: RolloutState, fleet: FleetSnapshot,
                  verdicts: Sequence[Verdict], shortage: str) -> _Move:
    """Apply the ``insufficient_data`` policy once the soak limit is reached."""
    label = spec.stage_label(state.stage)
    state = replace(state, verdicts=tuple(verdicts))
    if spec.insufficient_data == "promote":
        return _next_stage(spec, state, fleet.now,
                           f"{label}: {shortage}; promoting (insufficient_data=promote)", fleet,
                           verdicts)
    if spec.insufficient_data == "rollback":
        return _to(state, fleet.now, Phase.ROLLED_BACK,
                   f"{label}: {shortage}; rolling back (insufficient_data=rollback)", verdicts)
    return _to(state, fleet.now, Phase.PAUSED,
               f"{label}: {shortage}; holding (insufficient_data=hold): promote or roll back "
               f"by hand, or resume to soak again", verdicts, paused_from=Phase.SOAKING)


# -- operator actions ---------------------------------------------------------------------


def pause(spec: RolloutSpec, state: RolloutState, now: float,
          reason: str = "paused by operator") -> RolloutState:
    """Freeze the rollout where it is: assignments stay, no timers run, no gates act (an
    install failure still rolls back)."""
    if state.terminal or state.phase is Phase.PAUSED:
        raise RolloutError(f"cannot pause a rollout that is {state.phase.value}")
    return _to(state, now, Phase.PAUSED, reason, paused_from=state.phase).state


def resume(spec: RolloutSpec, state: RolloutState, now: float,
           reason: str = "resumed by operator") -> RolloutState:
    """Continue a paused rollout. The current stage starts over (new window, new soak):
    what was served while paused is not judged."""
    if state.phase is not Phase.PAUSED:
        raise RolloutError(f"cannot resume a rollout that is {state.phase.value}",
                           hint="only a paused rollout resumes")
    if state.paused_from is Phase.PENDING:
        return _to(state, now, Phase.PENDING, reason, paused_from=None).state
    return _start_stage(spec, state, now, state.stage, why=f"{reason}; ").state


def promote(spec: RolloutSpec, state: RolloutState, now: float,
            reason: str = "promoted by operator") -> RolloutState:
    """Skip the current stage's gates: go to the next stage, or promote after the last.
    (Needs the spec to know how many stages there are.)"""
    if state.terminal:
        raise RolloutError(f"cannot promote a rollout that is {state.phase.value}")
    return _next_stage(spec, state, now, f"{reason} (gates skipped)").state


def rollback(spec: RolloutSpec, state: RolloutState, now: float,
             reason: str = "rolled back by operator") -> RolloutState:
    """Every node of the tier back to the previous version (also after a promotion)."""
    if state.phase in (Phase.ROLLED_BACK, Phase.FAILED):
        raise RolloutError(f"cannot roll back a rollout that is {state.phase.value}")
    return _to(state, now, Phase.ROLLED_BACK, f"{reason}: back to {spec.name} {spec.previous}",
               paused_from=None).state
