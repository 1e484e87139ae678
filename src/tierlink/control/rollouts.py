"""The control plane's side of staged rollouts: a SQLite store and the controller around the
pure state machine of :mod:`tierlink.rollout`.

:class:`RolloutController` owns the I/O the machine leaves out:

* ``start(body)``: validate a ``POST /v1/rollouts`` body into a
  :class:`~tierlink.rollout.RolloutSpec` (``previous`` defaults to the version most of the
  tier's nodes report active; a repository, when there is one, must hold the version), take
  the first step at once and store it;
* ``tick()``: about once a second (the app's background task), for every rollout that is
  the latest of its ``(model, tier)``: build a :class:`~tierlink.rollout.FleetSnapshot` from
  the registry's alive nodes, call :func:`~tierlink.rollout.step` on live rollouts, persist
  the state, log (WARNING for rollbacks and failures, INFO otherwise) and count
  (``tierlink_rollout_transitions_total{model,from_phase,to_phase}``) every transition, and
  keep what every node should serve;
* ``desired_for(node_id)``: that, for the heartbeat answer — also after a rollout ended, so
  nodes converge on its outcome;
* operator actions (pause, resume, promote, rollback) and the records the API lists.

The snapshot holds, per node of the rollout's tier that serves the model (or reports an
install failure for it): its active and standby versions, the standby's weight, the decoded
stats of each version (a malformed stats dict is skipped and logged once, never fatal: the
heartbeat was accepted) and its install failures for the model.

Tables (in the control plane's SQLite file, created if absent; this module never touches
other tables or ``PRAGMA user_version``)::

    rollouts(id, name, tier, version, phase, live, spec, state, assignments, share,
             created_at, updated_at)          -- spec/state/assignments: JSON
    rollout_transitions(rollout_id, seq, at, from_phase, to_phase, stage, reason, verdicts)

At most one live rollout per model (a partial unique index backs the check). Times are the
control plane's clock (epoch seconds, injected).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from tierlink.control.schemas import NodeRecord
from tierlink.core.types import Tier
from tierlink.errors import (
    ConfigError,
    ControlPlaneError,
    InvalidRequest,
    RolloutError,
    RolloutNotFound,
)
from tierlink.rollout import (
    Assignment,
    Decision,
    FleetSnapshot,
    NodeSnapshot,
    Phase,
    RolloutSpec,
    RolloutState,
    Transition,
    VersionStats,
    assignments_for,
    check_cohort,
    default_stages,
    describe,
    expected_share,
    in_cohort,
    pause,
    promote,
    resume,
    rollback,
    step,
)
from tierlink.sqlite_store import mapped_errors, open_store

if TYPE_CHECKING:
    from tierlink.control.registry import RegistryService
    from tierlink.repo.service import RepositoryService

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Action = Callable[[RolloutSpec, RolloutState, float, str], RolloutState]
ACTIONS: dict[str, tuple[Action, str]] = {
    "pause": (pause, "paused by operator"),
    "resume": (resume, "resumed by operator"),
    "promote": (promote, "promoted by operator"),
    "rollback": (rollback, "rolled back by operator"),
}
_LIST_LIMIT = 200
_START_HINT = ("start the model's nodes first (`tierlink status` lists them); the name is the "
               "model name as `tierlink model list` shows it")


# -- store --------------------------------------------------------------------------------

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS rollouts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL,      -- the model name
    tier        TEXT NOT NULL,
    version     TEXT NOT NULL,
    phase       TEXT NOT NULL,
    live        INTEGER NOT NULL,   -- 1 while the phase is not terminal
    spec        TEXT NOT NULL,      -- RolloutSpec.to_dict()
    state       TEXT NOT NULL,      -- RolloutState.to_dict()
    assignments TEXT NOT NULL,      -- [Assignment.to_dict()] of the last step
    share       REAL NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
)
""",
    "CREATE UNIQUE INDEX IF NOT EXISTS rollouts_one_live ON rollouts (name) WHERE live = 1",
    "CREATE INDEX IF NOT EXISTS rollouts_by_target ON rollouts (name, tier, id)",
    """
CREATE TABLE IF NOT EXISTS rollout_transitions (
    rollout_id INTEGER NOT NULL,
    seq        INTEGER NOT NULL,    -- index in the state's history
    at         REAL NOT NULL,
    from_phase TEXT NOT NULL,
    to_phase   TEXT NOT NULL,
    stage      INTEGER NOT NULL,
    reason     TEXT NOT NULL,
    verdicts   TEXT NOT NULL,       -- JSON list of Verdict.to_dict()
    PRIMARY KEY (rollout_id, seq)
)
""",
)
_COLUMNS = "id, spec, state, assignments, share, created_at, updated_at"


@dataclass(frozen=True, slots=True)
class StoredRollout:
    """One row of ``rollouts``, decoded. ``assignments`` and ``share``: of the last step."""

    id: int
    spec: RolloutSpec
    state: RolloutState
    assignments: tuple[Assignment, ...]
    share: float
    created_at: float
    updated_at: float


class Rollouts(Protocol):
    """Where rollouts live: :class:`RolloutStore` (SQLite), or
    :class:`~tierlink.control.etcd_rollouts.EtcdRolloutStore` (shared by replicas)."""

    def create(self, spec: RolloutSpec, decision: Decision, now: float) -> StoredRollout: ...

    def save(self, rollout: StoredRollout, decision: Decision,
             now: float) -> StoredRollout: ...

    def get(self, rollout_id: int) -> StoredRollout | None: ...

    def recent(self, model: str | None = None, limit: int = ...) -> list[StoredRollout]: ...

    def current(self) -> tuple[list[StoredRollout], dict[int, str]]: ...

    def transitions(self, rollout_id: int) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class RolloutStore:
    """Rollouts and their transition log in the SQLite file at ``path`` (``":memory:"`` for
    tests). Thread-safe: one connection (WAL) serialised by a lock. ``ConfigError`` when a
    stored row does not decode; ``ControlPlaneError`` (503) when the disk fails."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._conn = _connect(self.path)

    def create(self, spec: RolloutSpec, decision: Decision, now: float) -> StoredRollout:
        """Store a new rollout after its first step; :class:`RolloutError` (409) when the
        model already has a live one."""
        with self._lock, self._guard("start a rollout"), self._conn:
            self._refuse_second_live(spec.name)
            try:
                cursor = self._conn.execute(
                    "INSERT INTO rollouts (name, tier, version, spec, phase, live, state,"
                    " assignments, share, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (spec.name, spec.tier.label, spec.version, json.dumps(spec.to_dict()),
                     *_mutable(decision), now, now))
            except sqlite3.IntegrityError:  # a concurrent start got there first
                raise RolloutError(f"{spec.name} already has a live rollout") from None
            rollout_id = int(cursor.lastrowid or 0)
            self._log(rollout_id, decision)
        return StoredRollout(rollout_id, spec, decision.state, decision.assignments,
                             decision.share, now, now)

    def save(self, rollout: StoredRollout, decision: Decision, now: float) -> StoredRollout:
        """Store ``rollout``'s next state (and log its new transitions)."""
        with self._lock, self._guard(f"save rollout {rollout.id}"), self._conn:
            self._conn.execute(
                "UPDATE rollouts SET phase = ?, live = ?, state = ?, assignments = ?,"
                " share = ?, updated_at = ? WHERE id = ?",
                (*_mutable(decision), now, rollout.id))
            self._log(rollout.id, decision)
        return StoredRollout(rollout.id, rollout.spec, decision.state, decision.assignments,
                             decision.share, rollout.created_at, now)

    def get(self, rollout_id: int) -> StoredRollout | None:
        rows = self._select("WHERE id = ?", (rollout_id,))
        return rows[0] if rows else None

    def recent(self, model: str | None = None, limit: int = _LIST_LIMIT) -> list[StoredRollout]:
        """Rollouts (of ``model``), newest first, at most ``limit``."""
        where, args = ("WHERE name = ?", (model,)) if model else ("", ())
        return self._select(f"{where} ORDER BY id DESC LIMIT ?", (*args, limit))

    def current(self) -> tuple[list[StoredRollout], dict[int, str]]:
        """The latest rollout of every ``(model, tier, cohort)`` (every live one among them),
        oldest first: what the nodes are told to serve; and the rows among them that cannot be
        decoded (id -> why), left out so that one damaged row does not stop the others."""
        damaged: dict[int, str] = {}
        rows = self._select("WHERE id IN (SELECT MAX(id) FROM rollouts GROUP BY name, tier,"
                            " COALESCE(json_extract(spec, '$.selector'), '{}')) ORDER BY id",
                            (), damaged)
        return rows, damaged

    def transitions(self, rollout_id: int) -> list[dict[str, Any]]:
        """Every transition of the rollout, in order: ``{at, from, to, stage, reason,
        verdicts}``."""
        with self._lock, self._guard("read a rollout's transitions"):
            rows = self._conn.execute(
                "SELECT at, from_phase, to_phase, stage, reason, verdicts FROM"
                " rollout_transitions WHERE rollout_id = ? ORDER BY seq", (rollout_id,)).fetchall()
        return [{"at": at, "from": src, "to": dst, "stage": stage, "reason": reason,
                 "verdicts": json.loads(verdicts)}
                for at, src, dst, stage, reason, verdicts in rows]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- helpers ---------------------------------------------------------------------------

    def _refuse_second_live(self, model: str) -> None:
        row = self._conn.execute("SELECT id, phase FROM rollouts WHERE name = ? AND live = 1",
                                 (model,)).fetchone()
        if row is not None:
            raise RolloutError(f"{model} already has a live rollout (id {row[0]}, {row[1]})",
                               hint=f"let it finish, or `tierlink rollout rollback {row[0]}` "
                                    f"or `promote {row[0]}` first")

    def _log(self, rollout_id: int, decision: Decision) -> None:
        history, new = decision.state.history, decision.transitions
        first = len(history) - len(new)
        self._conn.executemany(
            "INSERT OR IGNORE INTO rollout_transitions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(rollout_id, first + i, t.at, t.from_phase.value, t.to_phase.value, t.stage,
              t.reason, json.dumps([v.to_dict() for v in t.verdicts]))
             for i, t in enumerate(new)])

    def _select(self, tail: str, args: Sequence[Any],
                damaged: dict[int, str] | None = None) -> list[StoredRollout]:
        """Decoded rows; a damaged one raises ``ConfigError``, or with ``damaged`` given is
        left out and noted there (id -> why)."""
        with self._lock, self._guard("read rollouts"):
            rows = self._conn.execute(f"SELECT {_COLUMNS} FROM rollouts {tail}",
                                      tuple(args)).fetchall()
        decoded = []
        for row in rows:
            try:
                decoded.append(decode_row(row))
            except ConfigError as exc:
                if damaged is None:
                    raise
                damaged[int(row[0])] = exc.message
        return decoded

    def _guard(self, action: str) -> Any:
        return _sqlite_errors(self.path, action)


def _mutable(decision: Decision) -> tuple[Any, ...]:
    """The columns a step changes: phase, live, state, assignments, share."""
    state = decision.state
    return (state.phase.value, 0 if state.terminal else 1, json.dumps(state.to_dict()),
            json.dumps([a.to_dict() for a in decision.assignments]), decision.share)


def decode_row(row: Sequence[Any]) -> StoredRollout:
    """A stored rollout from its columns (id, spec, state, assignments as JSON text, share,
    created and updated at); ``ConfigError`` when it does not decode."""
    rollout_id, spec, state, assignments, share, created_at, updated_at = row
    try:
        decoded = [Assignment.from_dict(a) for a in json.loads(assignments)]
        return StoredRollout(int(rollout_id), RolloutSpec.from_dict(json.loads(spec)),
                             RolloutState.from_dict(json.loads(state)), tuple(decoded),
                             float(share), float(created_at), float(updated_at))
    except (ValueError, KeyError, TypeError) as exc:  # ConfigError is not among them
        raise ConfigError(f"stored rollout {rollout_id} is damaged: {exc!r}",
                          hint="roll the model back by hand and start a new rollout") from exc


def _connect(path: str) -> sqlite3.Connection:
    return open_store(path, _SCHEMA, ControlPlaneError, "rollout store")


def _sqlite_errors(path: str, action: str) -> AbstractContextManager[None]:
    return mapped_errors(lambda message: ControlPlaneError(
        message, hint="check the disk and the permissions of the control plane's --db file"),
        f"rollout store {path} failed to {action}")


# -- fleet snapshots ----------------------------------------------------------------------


def node_snapshot(record: NodeRecord, model: str,
                  problems: list[str] | None = None) -> NodeSnapshot | None:
    """What ``record`` says about ``model`` (None if it neither serves nor failed to install
    it). A stats dict that does not decode is left out and described in ``problems``."""
    entries = [m for m in record.models if m.name == model]
    failures = dict(record.install_failures.get(model, {}))
    if not entries and not failures:
        return None
    active = next((m for m in entries if m.role == "active"), None)
    standby = next((m for m in entries if m.role == "standby"), None)
    stats: dict[str, VersionStats] = {}
    for m in entries:
        if m.stats is None:
            continue
        try:
            stats[m.version] = VersionStats.from_dict(m.stats)
        except InvalidRequest as exc:
            if problems is not None:
                problems.append(f"{record.node_id} {model} {m.version}: {exc.message}")
    return NodeSnapshot(
        node_id=record.node_id, tier=Tier.parse(record.tier),
        active_version=active.version if active else None,
        standby_version=standby.version if standby else None,
        standby_weight=standby.weight if standby else None,
        stats=stats, install_failures=failures)


def tier_snapshot(records: Iterable[NodeRecord], model: str, tier: Tier, now: float,
                  problems: list[str] | None = None,
                  selector: Mapping[str, str] | None = None) -> FleetSnapshot:
    """The nodes of ``tier`` (with the labels of ``selector``: a cohort) that serve
    ``model`` (or failed to install it), at ``now``."""
    nodes = [node_snapshot(r, model, problems) for r in records
             if r.tier == tier.label and in_cohort(selector or {}, r.labels)]
    return FleetSnapshot(now, tuple(n for n in nodes if n is not None))


def majority_active(fleet: FleetSnapshot, model: str, tier: Tier) -> str:
    """The version most of the tier's nodes serve as active: a rollout's default
    ``previous``. :class:`RolloutError` when no node serves ``model`` or the nodes split
    evenly."""
    tally = Tally(n.active_version for n in fleet.tier_nodes(tier) if n.active_version)
    ranked = tally.most_common()
    if not ranked:
        raise RolloutError(f"no alive {tier.label} node serves model {model!r}",
                           hint=_START_HINT)
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        split = ", ".join(f"{c} node{'s' if c > 1 else ''} on {v}" for v, c in sorted(ranked))
        raise RolloutError(f"the {tier.label} nodes of {model} disagree on the active "
                           f"version ({split})",
                           hint="say which one to compare with and roll back to: --previous")
    return ranked[0][0]


def spec_from_body(body: Mapping[str, Any], previous: str) -> RolloutSpec:
    """A :class:`RolloutSpec` from a start body (``canary`` becomes ``stages``; fields left
    out or null take the spec's defaults). ``ConfigError`` names a bad field."""
    data = {k: v for k, v in body.items() if v is not None and k != "canary"}
    if body.get("canary") is not None:
        if body.get("stages") is not None:
            raise ConfigError("give stages or canary, not both",
                              hint="--canary 10% means stages 10%, 50%, 100%")
        data["stages"] = default_stages(float(body["canary"]))
    data["previous"] = previous
    cohorts = data.get("cohorts")
    if cohorts:  # the first cohort now, the rest one after another
        data["selector"] = _first_cohort(body)
        data["cohorts"] = cohorts[1:]
    return RolloutSpec.from_dict(data)


# -- controller ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Published:
    """What a rollout tells its tier's nodes to serve."""

    name: str
    tier: str
    assignments: tuple[Assignment, ...]
    cohort: str = ""  # RolloutSpec.cohort_key: "" for the whole tier

    @classmethod
    def of(cls, rollout: StoredRollout,
           assignments: tuple[Assignment, ...] | None = None) -> _Published:
        return cls(rollout.spec.name, rollout.spec.tier.label,
                   rollout.assignments if assignments is None else assignments,
                   rollout.spec.cohort_key)


class RolloutController:
    """Runs the rollouts: see the module doc. Thread-safe (one lock for every change);
    ``desired_for`` is lock-free (it reads an immutable snapshot) because every heartbeat
    calls it. ``registry`` gives the alive nodes; ``clock`` stamps everything;
    ``metrics``: the registry the transition counter goes in; ``repository``: when given,
    only published versions may be rolled out."""

    def __init__(self, store: Rollouts, registry: RegistryService, clock: Clock,
                 metrics: CollectorRegistry, repository: RepositoryService | None = None,
                 leader: Callable[[], bool] | None = None) -> None:
        self.store = store
        self.leader = leader  # None: this controller steps the rollouts alone
        self.registry = registry
        self.clock = clock
        self.repository = repository
        self.transitions_total = Counter(
            "tierlink_rollout_transitions", "Rollout phase transitions.",
            ["model", "from_phase", "to_phase"], registry=metrics)
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        # Resume where the store left off: nodes keep their assignments across a restart.
        current, damaged = store.current()
        self._report_damaged(damaged)
        self._published = {r.id: _Published.of(r) for r in current}
        self._desired = _desired(self._published)

    # -- the heartbeat answer --------------------------------------------------------------

    def desired_for(self, node_id: str) -> dict[str, dict[str, Any]]:
        """``{model: {"version", "weight"}}`` for ``node_id``: its assignment in the latest
        rollout of each model (live or finished) that has one for it."""
        return {model: dict(a) for model, a in self._desired.get(node_id, {}).items()}

    # -- start -----------------------------------------------------------------------------

    def start(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start a rollout from a ``POST /v1/rollouts`` body and take its first step.
        Raises ``ConfigError`` (400, a bad field), ``RepositoryError`` (404, the version is
        not published) or :class:`RolloutError` (409: one is live for the model, or no node
        of the tier serves it)."""
        name, tier = _text(body, "name"), _tier(body)
        version = _text(body, "version")
        with self._lock:
            if self.repository is not None:
                self.repository.version(name, version)  # RepositoryError (404) if unknown
            now = self.clock()
            selector = _first_cohort(body)
            fleet = tier_snapshot(self._alive(), name, tier, now, selector=selector)
            if not fleet.tier_nodes(tier):
                cohort = f" with labels {dict(selector)}" if selector else ""
                raise RolloutError(f"no alive {tier.label} node{cohort} serves model "
                                   f"{name!r}", hint=_START_HINT)
            previous = str(body.get("previous") or majority_active(fleet, name, tier))
            spec = spec_from_body({**body, "version": version}, previous)
            decision = step(spec, RolloutState.start(now), fleet)
            rollout = self.store.create(spec, decision, now)  # 409 if one is live
            self._announce(rollout.id, spec, decision.transitions)
            self._publish(rollout)
        return self.record(rollout, now)

    # -- tick ------------------------------------------------------------------------------

    def tick(self) -> None:
        """One round: step every live rollout on the current fleet, persist what changed,
        refresh what every node should serve (finished rollouts included).
        A damaged stored rollout is left as it was last published (nodes keep serving what
        they were told) and reported once; the others go on."""
        with self._lock:
            current, damaged = self.store.current()
            self._report_damaged(damaged)
            kept = {i: self._published[i] for i in damaged if i in self._published}
            if self.leader is not None and not self.leader():
                # Another replica steps them: tell nodes what it stored.
                published = {**kept, **{r.id: _Published.of(r) for r in current}}
                self._published, self._desired = published, _desired(published)
                return
            if not current:
                self._published, self._desired = kept, _desired(kept)
                return
            now, records = self.clock(), self._alive()
            published = {**kept, **{r.id: _Published.of(r, self._tick_one(r, records, now))
                                    for r in current}}
            self._published, self._desired = published, _desired(published)
            for rollout in self._next_cohorts(current, records, now):
                self._publish(rollout)

    def _tick_one(self, rollout: StoredRollout, records: Sequence[NodeRecord],
                  now: float) -> tuple[Assignment, ...]:
        spec, state = rollout.spec, rollout.state
        fleet = self._snapshot(records, spec, now)
        if state.terminal:
            return assignments_for(spec, state, fleet)
        if not fleet.nodes and state.phase is not Phase.PENDING:
            # Every node of the tier is silent (a network blip, a control-plane restart
            # before the first heartbeats): nothing to judge, and an empty stage would
            # read as "deployed". Hold until they are back.
            return rollout.assignments
        decision = step(spec, state, fleet)
        if decision.state != state or decision.assignments != rollout.assignments:
            try:
                self.store.save(rollout, decision, now)
            except RolloutError as exc:  # an operator acted at another replica meanwhile
                log.info("rollout %d: %s; stepping again next tick", rollout.id, exc)
                return rollout.assignments
            self._announce(rollout.id, spec, decision.transitions)
        return decision.assignments

    # -- operator actions ------------------------------------------------------------------

    def act(self, rollout_id: int, action: str, reason: str | None = None) -> dict[str, Any]:
        """Apply ``action`` (pause, resume, promote, rollback) to a rollout, ``reason``
        going into its log. :class:`RolloutError` (409) when it does not apply;
        :class:`RolloutNotFound` (404)."""
        if action not in ACTIONS:
            raise RolloutNotFound(f"no rollout action {action!r}",
                                  hint=f"one of {', '.join(ACTIONS)}")
        apply, default = ACTIONS[action]
        why = f"{default} ({reason})" if reason else default
        with self._lock:
            rollout = self._get(rollout_id)
            self._check_latest(rollout, action)
            now = self.clock()
            state = apply(rollout.spec, rollout.state, now, why)
            fleet = self._snapshot(self._alive(), rollout.spec, now)
            assignments = assignments_for(rollout.spec, state, fleet)
            new = state.history[len(rollout.state.history):]
            decision = Decision(state, new, assignments,
                                expected_share(assignments, rollout.spec.version), ())
            saved = self.store.save(rollout, decision, now)
            self._announce(saved.id, saved.spec, new)
            self._publish(saved)
        return self.record(saved, now)

    def _check_latest(self, rollout: StoredRollout, action: str) -> None:
        """Only the latest rollout of a (model, tier) is published: acting on an older one
        would change nothing on the nodes."""
        newer = [r for r in self.store.recent(rollout.spec.name)
                 if r.spec.tier == rollout.spec.tier and r.id > rollout.id]
        if newer:
            raise RolloutError(f"rollout {rollout.id} is not the latest of {rollout.spec.name} "
                               f"on {rollout.spec.tier.label} (rollout {newer[0].id} is)",
                               hint=f"{action} rollout {newer[0].id} instead")

    # -- records ---------------------------------------------------------------------------

    def get(self, rollout_id: int) -> dict[str, Any]:
        """One rollout's record with its ``transitions``; :class:`RolloutNotFound`."""
        rollout = self._get(rollout_id)
        return {**self.record(rollout, self.clock()),
                "transitions": self.store.transitions(rollout_id)}

    def records(self, model: str | None = None) -> list[dict[str, Any]]:
        """Records of the rollouts (of ``model``), newest first."""
        now = self.clock()
        return [self.record(r, now) for r in self.store.recent(model)]

    def record(self, rollout: StoredRollout, now: float) -> dict[str, Any]:
        """The API's view of a rollout (see the contract in ``docs/explanation/control-plane.md``)."""
        return {"id": rollout.id, "spec": rollout.spec.to_dict(),
                "state": rollout.state.to_dict(), "phase": rollout.state.phase.value,
                "describe": describe(rollout.spec, rollout.state, now),
                "assignments": [a.to_dict() for a in rollout.assignments],
                "share": rollout.share, "created_at": rollout.created_at,
                "updated_at": rollout.updated_at}

    # -- helpers ---------------------------------------------------------------------------

    def _get(self, rollout_id: int) -> StoredRollout:
        rollout = self.store.get(rollout_id)
        if rollout is None:
            raise RolloutNotFound(f"no rollout with id {rollout_id}")
        return rollout

    def _alive(self) -> list[NodeRecord]:
        return self.registry.alive()[1]

    def _report_damaged(self, damaged: Mapping[int, str]) -> None:
        for rollout_id, why in damaged.items():
            if f"rollout {rollout_id}" not in self._reported:  # once, not every second
                self._reported.add(f"rollout {rollout_id}")
                log.error("%s; it is skipped, the other rollouts go on", why)

    def _snapshot(self, records: Sequence[NodeRecord], spec: RolloutSpec,
                  now: float) -> FleetSnapshot:
        problems: list[str] = []
        fleet = tier_snapshot(records, spec.name, spec.tier, now, problems, spec.selector)
        for problem in problems:
            if problem not in self._reported:  # once, not every second
                self._reported.add(problem)
                log.warning("ignoring malformed version stats from %s", problem)
        return fleet

    def _announce(self, rollout_id: int, spec: RolloutSpec,
                  transitions: Iterable[Transition]) -> None:
        """Log and count transitions."""
        for t in transitions:
            level = logging.WARNING if t.to_phase in (Phase.ROLLED_BACK, Phase.FAILED) \
                else logging.INFO
            log.log(level, "rollout %d of %s %s: %s -> %s: %s", rollout_id, spec.name,
                    spec.version, t.from_phase.value, t.to_phase.value, t.reason)
            self.transitions_total.labels(model=spec.name, from_phase=t.from_phase.value,
                                    to_phase=t.to_phase.value).inc()

    def _publish(self, rollout: StoredRollout) -> None:
        """Make ``rollout`` what its (model, tier, cohort)'s nodes are told to serve."""
        entry = _Published.of(rollout)
        published = {i: p for i, p in self._published.items()
                     if (p.name, p.tier, p.cohort) != (entry.name, entry.tier, entry.cohort)}
        published[rollout.id] = entry
        self._published, self._desired = published, _desired(published)

    def _next_cohorts(self, current: Sequence[StoredRollout], records: Sequence[NodeRecord],
                      now: float) -> list[StoredRollout]:
        """The next cohort of every rollout that was just promoted (and is still its
        model's latest), started as a rollout of its own."""
        started = []
        for rollout in current:
            if not rollout.spec.cohorts:
                continue  # no cohort follows it: nothing to read
            latest = self.store.get(rollout.id)
            if latest is None or latest.state.phase is not Phase.PROMOTED \
                    or not latest.spec.cohorts or self._has_later(latest):
                continue
            spec = replace(latest.spec, selector=latest.spec.cohorts[0],
                           cohorts=latest.spec.cohorts[1:])
            fleet = self._snapshot(records, spec, now)
            decision = step(spec, RolloutState.start(now), fleet)
            try:
                started.append(self.store.create(spec, decision, now))
            except RolloutError as exc:  # another live rollout of the model meanwhile
                log.info("rollout %d: the next cohort waits: %s", rollout.id, exc)
                continue
            self._announce(started[-1].id, spec, decision.transitions)
        return started

    def _has_later(self, rollout: StoredRollout) -> bool:
        """Has a rollout of the same model started after ``rollout``?"""
        return any(r.id > rollout.id for r in self.store.recent(rollout.spec.name, 1))


def _desired(published: Mapping[int, _Published]) -> dict[str, dict[str, dict[str, Any]]]:
    """node id -> model -> {"version", "weight"}: oldest rollout first, so that where two
    assign a node (a whole-tier rollout, then a cohort's) the later one counts."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for _, entry in sorted(published.items()):
        for a in entry.assignments:
            out.setdefault(a.node_id, {})[entry.name] = {"version": a.version,
                                                         "weight": a.weight}
    return out


def _first_cohort(body: Mapping[str, Any]) -> Mapping[str, str]:
    """The labels of the nodes a start body's first cohort takes ({}: the whole tier);
    ``ConfigError`` for cohorts that are not label mappings."""
    cohorts, selector = body.get("cohorts"), body.get("selector")
    if cohorts and selector:
        raise ConfigError("give cohorts or selector, not both",
                          hint="cohorts: [{hw: a}, {hw: b}] rolls out to hw=a first")
    listed = cohorts if cohorts else [selector] if selector else []
    if not isinstance(listed, list):
        raise ConfigError(f"rollout cohorts must be a list of label mappings, got {listed!r}",
                          hint='e.g. [{"hw": "a"}, {"hw": "b"}]')
    for cohort in listed:  # every one, before any node is looked at
        check_cohort(cohort)
    return listed[0] if listed else {}


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        raise ConfigError(f"rollout {name} must be a non-empty string, got {value!r}",
                          hint="e.g. {\"name\": \"fmnist-large\", \"version\": \"2\", "
                               "\"tier\": \"edge\"}")
    return str(value)


def _tier(body: Mapping[str, Any]) -> Tier:
    try:
        return Tier.parse(_text(body, "tier"))
    except ValueError as exc:
        raise ConfigError(f"rollout tier: {exc}", hint="tier: device, edge or cloud") from None
