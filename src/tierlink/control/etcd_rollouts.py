"""Rollouts on etcd, shared by control-plane replicas (the same methods as
:class:`~tierlink.control.rollouts.RolloutStore`).

Keys (under ``prefix``, default ``/tierlink/rollouts/``), JSON values::

    next-id                 the last id handed out
    r/<id, 10 digits>       a rollout: spec, state, assignments, share, created/updated at
    live/<model>            the id of the model's live rollout (at most one: a start is a
                            transaction on this key being absent)
    t/<id>/<seq, 6 digits>  one transition of a rollout's log

A save is a transaction on the rollout's key being as this replica last read it: when an
operator's action at another replica got there first, the save is refused (409) and the
next tick steps from what was stored, so no change is lost. One replica steps the rollouts
(the leader: :class:`~tierlink.etcd.leader.Leadership`); the others publish what is stored.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from tierlink.control.rollouts import StoredRollout, decode_row
from tierlink.errors import ConfigError, RolloutError
from tierlink.etcd.client import Compare, Etcd, KeyValue, Op
from tierlink.rollout import Decision, RolloutSpec

DEFAULT_PREFIX = "/tierlink/rollouts/"
_LIST_LIMIT = 100


class EtcdRolloutStore:
    """See the module. Thread-safe (etcd transactions; a lock for the read revisions)."""

    def __init__(self, etcd: Etcd, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.etcd = etcd
        self.prefix = prefix
        self._read_at: dict[int, int] = {}  # rollout id -> mod revision as last read
        self._lock = threading.Lock()

    def create(self, spec: RolloutSpec, decision: Decision, now: float) -> StoredRollout:
        counter_key, live_key = self.prefix + "next-id", self.prefix + "live/" + spec.name
        for _ in range(10):
            live = self.etcd.get(live_key)
            if live is not None:
                raise RolloutError(
                    f"{spec.name} already has a live rollout (id {int(live.value)})",
                    hint=f"let it finish, or `tierlink rollout rollback {int(live.value)}` "
                         f"or `promote {int(live.value)}` first")
            counter = self.etcd.get(counter_key)
            rollout_id = 1 + (int(counter.value) if counter else 0)
            doc = _doc(rollout_id, spec.to_dict(), decision, now, now)
            ops = [Op("put", counter_key, str(rollout_id).encode()),
                   Op("put", self._key(rollout_id), doc), *self._log(rollout_id, decision)]
            if not decision.state.terminal:
                ops.append(Op("put", live_key, str(rollout_id).encode()))
            guard = Compare(counter_key, "mod", counter.mod_revision) if counter \
                else Compare(counter_key, "version", 0)
            held, revision = self.etcd.txn([guard, Compare(live_key, "version", 0)], ops)
            if held:
                self._note(rollout_id, revision)
                return StoredRollout(rollout_id, spec, decision.state, decision.assignments,
                                     decision.share, now, now)
        raise RolloutError(f"could not start a rollout of {spec.name}: ids kept moving",
                           hint="retry")

    def save(self, rollout: StoredRollout, decision: Decision, now: float) -> StoredRollout:
        key = self._key(rollout.id)
        with self._lock:
            read_at = self._read_at.get(rollout.id)
        doc = _doc(rollout.id, rollout.spec.to_dict(), decision, rollout.created_at, now)
        ops = [Op("put", key, doc), *self._log(rollout.id, decision)]
        if decision.state.terminal:
            ops.append(Op("delete", self.prefix + "live/" + rollout.spec.name))
        guard = [Compare(key, "mod", read_at)] if read_at else []
        held, revision = self.etcd.txn(guard, ops)
        if not held:
            raise RolloutError(f"rollout {rollout.id} changed at another replica meanwhile",
                               hint="read it again and retry")
        self._note(rollout.id, revision)
        return StoredRollout(rollout.id, rollout.spec, decision.state, decision.assignments,
                             decision.share, rollout.created_at, now)

    def get(self, rollout_id: int) -> StoredRollout | None:
        kv = self.etcd.get(self._key(rollout_id))
        return None if kv is None else self._decode(kv)

    def recent(self, model: str | None = None, limit: int = _LIST_LIMIT) -> list[StoredRollout]:
        rows = [r for r in self._all({}) if model is None or r.spec.name == model]
        return sorted(rows, key=lambda r: -r.id)[:limit]

    def current(self) -> tuple[list[StoredRollout], dict[int, str]]:
        damaged: dict[int, str] = {}
        latest: dict[tuple[str, str, str], StoredRollout] = {}
        for r in self._all(damaged):
            target = (r.spec.name, r.spec.tier.label, r.spec.cohort_key)
            if target not in latest or latest[target].id < r.id:
                latest[target] = r
        return sorted(latest.values(), key=lambda r: r.id), damaged

    def transitions(self, rollout_id: int) -> list[dict[str, Any]]:
        kvs, _ = self.etcd.prefix(f"{self.prefix}t/{rollout_id:010d}/")
        out = []
        for kv in sorted(kvs, key=lambda kv: kv.key):
            t = json.loads(kv.value)
            out.append({"at": t["at"], "from": t["from"], "to": t["to"], "stage": t["stage"],
                        "reason": t["reason"], "verdicts": t["verdicts"]})
        return out

    def close(self) -> None:
        """Nothing to release: the etcd client is the caller's."""

    # -- helpers ---------------------------------------------------------------------------

    def _key(self, rollout_id: int) -> str:
        return f"{self.prefix}r/{rollout_id:010d}"

    def _all(self, damaged: dict[int, str]) -> list[StoredRollout]:
        kvs, _ = self.etcd.prefix(self.prefix + "r/")
        rows = []
        for kv in kvs:
            try:
                rows.append(self._decode(kv))
            except ConfigError as exc:
                damaged[int(kv.key.rsplit("/", 1)[1])] = exc.message
        return rows

    def _decode(self, kv: KeyValue) -> StoredRollout:
        rollout_id = int(kv.key.rsplit("/", 1)[1])
        try:
            doc = json.loads(kv.value)
            row = (rollout_id, json.dumps(doc["spec"]), json.dumps(doc["state"]),
                   json.dumps(doc["assignments"]), doc["share"], doc["created_at"],
                   doc["updated_at"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"stored rollout {rollout_id} is damaged: {exc!r}",
                              hint="roll the model back by hand and start a new rollout") \
                from exc
        decoded = decode_row(row)
        self._note(rollout_id, kv.mod_revision)
        return decoded

    def _note(self, rollout_id: int, revision: int) -> None:
        with self._lock:
            self._read_at[rollout_id] = revision

    def _log(self, rollout_id: int, decision: Decision) -> list[Op]:
        history, new = decision.state.history, decision.transitions
        first = len(history) - len(new)
        return [Op("put", f"{self.prefix}t/{rollout_id:010d}/{first + i:06d}",
                   json.dumps({"at": t.at, "from": t.from_phase.value, "to": t.to_phase.value,
                               "stage": t.stage, "reason": t.reason,
                               "verdicts": [v.to_dict() for v in t.verdicts]}).encode())
                for i, t in enumerate(new)]


def _doc(rollout_id: int, spec: dict[str, Any], decision: Decision, created_at: float,
         updated_at: float) -> bytes:
    state = decision.state
    return json.dumps({"id": rollout_id, "spec": spec, "state": state.to_dict(),
                       "assignments": [a.to_dict() for a in decision.assignments],
                       "share": decision.share, "live": not state.terminal,
                       "created_at": created_at, "updated_at": updated_at}).encode()
