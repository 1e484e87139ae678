"""A small simulated fleet for the rollout controller tests.

``SimNode`` is a node as the heartbeat contract describes it: an active and a standby slot
for one model, the standby's weight, cumulative per-version counters, install failures. It
obeys a heartbeat answer's ``desired`` the way a node does, serves expected request counts
(no randomness) and reports them in its heartbeats. ``Sim`` drives rounds on a fake clock:
every node heartbeats through the registry (and obeys the answer), serves a second of
traffic, the clock moves one second, the controller ticks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierlink.control.registry import RegistryService
from tierlink.control.rollouts import RolloutController
from tierlink.control.schemas import Heartbeat
from tierlink.rollout import CONFIDENCE_BINS, LATENCY_BUCKETS_MS

MODEL = "fmnist-large"
STARTED = 1_733_139_000.0


@dataclass(frozen=True)
class Behaviour:
    """How a version answers: error rate, latency bucket, accuracy on labelled feedback."""

    error_rate: float = 0.005
    latency_bucket: int = 3
    accuracy: float = 0.91
    feedback_share: float = 0.5
    escalation_rate: float = 0.1


GOOD = Behaviour()


@dataclass
class Counts:
    requests: float = 0.0
    errors: float = 0.0
    escalations: float = 0.0
    feedback: float = 0.0
    correct: float = 0.0

    def add(self, n: float, b: Behaviour) -> None:
        self.requests += n
        self.errors += n * b.error_rate
        self.escalations += n * b.escalation_rate
        labelled = n * (1 - b.error_rate) * b.feedback_share
        self.feedback += labelled
        self.correct += labelled * b.accuracy

    def stats(self, b: Behaviour) -> dict[str, Any]:
        """The counters as ``VersionStatsBook.get`` reports them (whole numbers)."""
        requests, errors = int(self.requests), int(self.errors)
        latency = [0] * len(LATENCY_BUCKETS_MS)
        latency[b.latency_bucket] = requests - errors
        confidence = [0] * CONFIDENCE_BINS
        confidence[-1] = requests - errors
        return {"requests": requests, "errors": errors, "escalations": int(self.escalations),
                "latency_ms_buckets": latency, "confidence_buckets": confidence,
                "feedback": int(self.feedback), "feedback_correct": int(self.correct),
                "since": STARTED}


@dataclass
class SimNode:
    node_id: str
    active: str
    tier: str = "edge"
    standby: str | None = None
    weight: float = 0.0  # the standby's share
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)  # version -> install error
    failures: dict[str, str] = field(default_factory=dict)
    counts: dict[str, Counts] = field(default_factory=dict)
    bad_stats: bool = False
    labels: dict[str, str] = field(default_factory=dict)

    def obey(self, desired: dict[str, Any]) -> None:
        """Reconcile with a heartbeat answer's ``desired`` (the node's contract)."""
        want = desired.get(MODEL)
        if want is None:
            return
        version, weight = str(want["version"]), float(want["weight"])
        self.failures = {v: e for v, e in self.failures.items() if v == version}
        if version in self.broken and version not in (self.active, self.standby):
            self.failures[version] = self.broken[version]
            return
        if weight >= 1.0:
            if version != self.active:
                self.standby, self.active = self.active, version
            self.weight = 0.0
        elif version != self.active:
            self.standby, self.weight = version, weight

    def serve(self, n: float) -> None:
        on_standby = n * self.weight if self.standby else 0.0
        self._count(self.active, n - on_standby)
        if self.standby:
            self._count(self.standby, on_standby)

    def _count(self, version: str, n: float) -> None:
        self.counts.setdefault(version, Counts()).add(n, self.behaviours.get(version, GOOD))

    def body(self) -> dict[str, Any]:
        models = [self._entry(self.active, "active", 1.0 - self.weight)]
        if self.standby is not None:
            models.append(self._entry(self.standby, "standby", self.weight))
        return {"node_id": self.node_id, "tier": self.tier,
                "address": f"http://127.0.0.1:{8100 + int(self.node_id[-1])}",
                "models": models, "started_at": STARTED, "labels": dict(self.labels),
                "install_failures": {MODEL: dict(self.failures)} if self.failures else {}}

    def _entry(self, version: str, role: str, weight: float) -> dict[str, Any]:
        counts = self.counts.get(version, Counts())
        stats = counts.stats(self.behaviours.get(version, GOOD))
        if self.bad_stats:
            stats["requests"] = -1
        return {"name": MODEL, "task": "fmnist", "version": version, "accuracy": 0.91,
                "latency_ms": 2.0, "role": role, "weight": weight, "stats": stats}


class Sim:
    """Rounds of heartbeats, traffic and ticks on a fake clock."""

    def __init__(self, nodes: list[SimNode], registry: RegistryService,
                 controller: RolloutController, clock: Any, rps: float = 100.0) -> None:
        self.nodes = nodes
        self.registry = registry
        self.controller = controller
        self.clock = clock
        self.rps = rps

    def beat(self) -> None:
        """Every node heartbeats and obeys the answer (as the app's handler gives it)."""
        for node in self.nodes:
            self.registry.heartbeat(Heartbeat.model_validate(node.body()))
            node.obey(self.controller.desired_for(node.node_id))

    def round(self) -> None:
        self.beat()
        for node in self.nodes:
            node.serve(self.rps)
        self.clock.advance(1.0)
        self.controller.tick()

    def run_until(self, done: Callable[[], bool], rounds: int = 200) -> int:
        """Rounds until ``done()``; the number it took. Fails after ``rounds``."""
        for i in range(rounds):
            if done():
                return i
            self.round()
        raise AssertionError(f"not done after {rounds} rounds")
