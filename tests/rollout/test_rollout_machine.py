"""The rollout machine driven against a small deterministic fleet simulator.

``SimFleet`` serves expected counts (no randomness): each node takes ``rps`` requests a
second for the model, split between its active and standby versions by the standby weight,
and each version behaves as its :class:`Behaviour` says. Time only moves when the test
advances it; the machine reads it from the snapshot.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field, replace

import pytest

from tierlink.core.types import Tier
from tierlink.errors import ConfigError, RolloutError
from tierlink.rollout import (
    LATENCY_BUCKETS_MS,
    FleetSnapshot,
    Gates,
    NodeSnapshot,
    Outcome,
    Phase,
    RolloutSpec,
    RolloutState,
    VersionStats,
    assignments_for,
    converged,
    default_stages,
    describe,
    pause,
    promote,
    resume,
    rollback,
    step,
)
from tierlink.rollout.traffic import canary_order

NB = len(LATENCY_BUCKETS_MS)
FAST = (0, 0, 0, 0.2, 0.7, 0.1) + (0,) * (NB - 6)  # p95 ~ 35 ms
SLOW = (0, 0, 0, 0, 0, 0.2, 0.7, 0.1) + (0,) * (NB - 8)  # p95 ~ 150 ms
CONF = (0, 0, 0, 0, 0.01, 0.02, 0.03, 0.06, 0.13, 0.75)
SHIFTED = (0.02, 0.03, 0.05, 0.1, 0.15, 0.15, 0.15, 0.15, 0.1, 0.1)


@dataclass(frozen=True)
class Behaviour:
    error_rate: float = 0.005
    escalation_rate: float = 0.10
    latency: tuple[float, ...] = FAST
    confidence: tuple[float, ...] = CONF
    accuracy: float = 0.91
    feedback_share: float = 0.5
    crash: str = ""  # install fails with this message


GOOD = Behaviour()


@dataclass
class Counters:
    since: float
    values: dict[str, float] = field(default_factory=dict)
    latency: list[float] = field(default_factory=lambda: [0.0] * NB)
    confidence: list[float] = field(default_factory=lambda: [0.0] * 10)

    def add(self, n: float, b: Behaviour) -> None:
        ok = n * (1 - b.error_rate)
        fb = ok * b.feedback_share
        for key, x in (("requests", n), ("errors", n * b.error_rate),
                       ("escalations", n * b.escalation_rate), ("feedback", fb),
                       ("feedback_correct", fb * b.accuracy)):
            self.values[key] = self.values.get(key, 0.0) + x
        for i, s in enumerate(b.latency):
            self.latency[i] += ok * s
        for i, s in enumerate(b.confidence):
            self.confidence[i] += ok * s

    def stats(self) -> VersionStats:
        f = {k: math.floor(v + 1e-9) for k, v in self.values.items()}
        return VersionStats(
            latency_ms_buckets=tuple(math.floor(x + 1e-9) for x in self.latency),
            confidence_buckets=tuple(math.floor(x + 1e-9) for x in self.confidence),
            since=self.since, **f)


@dataclass
class SimNode:
    node_id: str
    tier: Tier
    active: str
    standby: str | None = None
    standby_weight: float = 0.0
    counters: dict[str, Counters] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    stuck: bool = False


class SimFleet:
    def __init__(self, n=2, behaviours=None, rps=20.0, previous="1", warmup_s=60.0,
                 stuck=(), report_weight=True, cloud_nodes=1):
        self.now = 1000.0
        self.rps = rps
        self.behaviours = {previous: GOOD, **(behaviours or {})}
        self.report_weight = report_weight
        self.nodes = [SimNode(f"edge-{i}", Tier.EDGE, previous, stuck=f"edge-{i}" in stuck)
                      for i in range(1, n + 1)]
        self.nodes += [SimNode(f"cloud-{i}", Tier.CLOUD, previous)
                       for i in range(1, cloud_nodes + 1)]
        self.advance(warmup_s)

    def node(self, node_id) -> SimNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def apply(self, assignments) -> None:
        for a in assignments:
            node = self.node(a.node_id)
            crash = self.behaviours.get(a.version, GOOD).crash
            if node.stuck:
                continue
            if crash:
                node.failures[a.version] = crash
            elif a.weight >= 1.0:
                if node.active != a.version:
                    node.standby, node.active = node.active, a.version
                node.standby_weight = 0.0
            else:
                node.standby, node.standby_weight = a.version, a.weight

    def advance(self, seconds: float) -> None:
        for node in self.nodes:
            n = self.rps * seconds
            w = node.standby_weight if node.standby else 0.0
            for version, share in ((node.active, 1 - w), (node.standby, w)):
                if version is not None and share > 0:
                    c = node.counters.setdefault(version, Counters(self.now))
                    c.add(n * share, self.behaviours.get(version, GOOD))
        self.now += seconds

    def restart(self, node_id: str) -> None:
        self.node(node_id).counters.clear()

    def snapshot(self, shuffle: random.Random | None = None) -> FleetSnapshot:
        nodes = [NodeSnapshot(n.node_id, n.tier, n.active, n.standby,
                              {v: c.stats() for v, c in n.counters.items()}, dict(n.failures),
                              n.standby_weight if self.report_weight else None)
                 for n in self.nodes]
        if shuffle is not None:
            shuffle.shuffle(nodes)
        return FleetSnapshot(self.now, tuple(nodes))


def spec(**kw) -> RolloutSpec:
    base = {"name": "fmnist-medium", "version": "2", "previous": "1", "tier": Tier.EDGE,
            "stages": (0.1, 0.5, 1.0), "soak_s": 30.0, "min_requests": 100}
    base.update(kw)
    return RolloutSpec(**base)


@dataclass
class Run:
    state: RolloutState
    decisions: list
    max_share_by_stage: dict[int, float]
    seconds: float

    @property
    def reasons(self):
        return [t.reason for t in self.state.history]

    @property
    def phases(self):
        return [(t.to_phase.value, t.stage) for t in self.state.history]


def drive(sp, sim, state=None, until_s=600.0, persist=False, hook=None, shuffle=None) -> Run:
    """Step once a second until the rollout ends and the fleet has converged."""
    state = state or RolloutState.start(sim.now)
    start, decisions, shares = sim.now, [], {}
    while sim.now - start <= until_s:
        if hook:
            hook(sim, state)
        d = step(sp, state, sim.snapshot(shuffle))
        decisions.append(d)
        sim.apply(d.assignments)
        state = d.state
        if not state.terminal:
            shares[state.stage] = max(shares.get(state.stage, 0.0), d.share)
        if persist:
            state = RolloutState.from_dict(json.loads(json.dumps(state.to_dict())))
        if state.terminal and converged(d.assignments, sim.snapshot()):
            break
        sim.advance(1.0)
    return Run(state, decisions, shares, sim.now - start)


def rollback_reason(run: Run) -> str:
    assert run.state.phase is Phase.ROLLED_BACK, run.reasons
    return run.state.history[-1].reason


# -- the happy path ------------------------------------------------------------------


def test_healthy_rollout_goes_stage_by_stage_to_promoted():
    sim = SimFleet(n=2)
    run = drive(spec(), sim)
    assert run.phases == [("deploying", 0), ("soaking", 0), ("deploying", 1), ("soaking", 1),
                          ("deploying", 2), ("soaking", 2), ("promoted", 2)]
    assert run.state.phase is Phase.PROMOTED
    assert "edge-" in run.reasons[0] and "weight 0.20" in run.reasons[0]
    assert "stage 1/3 (10%) passed every gate" in run.reasons[2]
    passed = run.state.history[2]
    assert {v.gate for v in passed.verdicts} == {"error_rate", "p95_latency", "escalation_rate",
                                                 "confidence_psi", "feedback_accuracy",
                                                     "agreement"}
    assert all(v.outcome in (Outcome.PASS, Outcome.INSUFFICIENT) for v in passed.verdicts)
    passing = next(d for d in run.decisions if d.transitions and d.transitions[0] is passed)
    assert passing.verdicts == passed.verdicts
    assert all(n.active == "2" for n in sim.nodes if n.tier is Tier.EDGE)
    assert all(n.active == "1" for n in sim.nodes if n.tier is Tier.CLOUD)  # other tier
    assert run.max_share_by_stage == pytest.approx({0: 0.1, 1: 0.5, 2: 1.0})
    last = run.decisions[-1]
    assert last.share == 1.0 and all(a.version == "2" for a in last.assignments)
    # the last stage had no previous-version traffic left: it was judged against the
    # previous version before the stage
    assert any("before this stage" in v.reason for v in run.state.verdicts)


def test_single_full_stage_uses_history_of_previous_version():
    run = drive(spec(stages=(1.0,)), SimFleet(n=3))
    assert run.state.phase is Phase.PROMOTED
    verdicts = {v.gate: v for v in run.state.verdicts}
    assert verdicts["error_rate"].outcome is Outcome.PASS
    assert "before this stage" in verdicts["error_rate"].reason


def test_without_reported_standby_weight_slots_decide():
    run = drive(spec(), SimFleet(n=3, report_weight=False))
    assert run.state.phase is Phase.PROMOTED


# -- automatic rollbacks ---------------------------------------------------------------


@pytest.mark.parametrize("bad, words", [
    (Behaviour(error_rate=0.2), "error rate"),
    (Behaviour(latency=SLOW), "p95 latency"),
    (Behaviour(escalation_rate=0.4), "escalation rate"),
    (Behaviour(confidence=SHIFTED), "confidence drift PSI"),
])
def test_bad_version_rolls_back_in_the_canary_stage(bad, words):
    sim = SimFleet(n=2, behaviours={"2": bad})
    run = drive(spec(), sim)
    reason = rollback_reason(run)
    assert reason.startswith("stage 1/3 (10%): ") and words in reason
    assert run.state.history[-1].stage == 0
    assert run.max_share_by_stage == {0: pytest.approx(0.1)}  # never more than the canary
    assert all(n.active == "1" and n.standby_weight == 0 for n in sim.nodes)
    assert all(a.version == "1" and a.weight == 1.0 for a in run.decisions[-1].assignments)
    failed = [v for v in run.state.verdicts if v.outcome is Outcome.FAIL]
    assert failed and all(v.reason in reason for v in failed)
    assert run.state.history[-1].verdicts == run.state.verdicts  # recorded with the move


def test_fail_fast_rolls_back_before_the_soak_ends():
    sim = SimFleet(n=2, behaviours={"2": Behaviour(error_rate=0.5)})
    run = drive(spec(soak_s=300.0), sim)
    rollback_reason(run)
    assert run.seconds < 60  # ~25 s to reach 100 requests at 4 rps, not 300 s

    sim = SimFleet(n=2, behaviours={"2": Behaviour(error_rate=0.5)})
    slow = drive(spec(soak_s=300.0, fail_fast=False), sim)
    rollback_reason(slow)
    assert slow.seconds >= 300


def test_accuracy_drop_with_enough_feedback_rolls_back():
    sim = SimFleet(n=2, behaviours={"2": Behaviour(accuracy=0.80, feedback_share=1.0)})
    run = drive(spec(gates=Gates(min_feedback=100)), sim)
    reason = rollback_reason(run)
    assert re.search(r"accuracy on labelled feedback (79|80)\.\d% vs (90|91)\.\d% "
                     r"\(-1\d\.\d pt, drop > 2\.0 pt\) over \d+ answers", reason), reason
    assert run.max_share_by_stage == {0: pytest.approx(0.1)}


def test_accuracy_drop_with_too_little_feedback_is_not_judged():
    sim = SimFleet(n=2, behaviours={"2": Behaviour(accuracy=0.5, feedback_share=0.001)})
    run = drive(spec(), sim)
    assert run.state.phase is Phase.PROMOTED
    assert "not judged: feedback_accuracy" in run.reasons[2]
    acc = {v.gate: v for v in run.state.verdicts}["feedback_accuracy"]
    assert acc.outcome is Outcome.INSUFFICIENT


def test_install_failure_rolls_back_at_once_naming_node_and_error():
    crash = "onnxruntime could not load model.onnx: invalid graph (crashed on load)"
    sim = SimFleet(n=2, behaviours={"2": Behaviour(crash=crash)})
    run = drive(spec(), sim)
    reason = rollback_reason(run)
    canary = canary_order("fmnist-medium", "2", ["edge-1", "edge-2"])[0]
    assert reason == f"fmnist-medium 2 failed to install on {canary}: {crash}"
    assert run.seconds <= 1.0  # the first heartbeat after the attempt
    assert run.state.history[-1].from_phase is Phase.DEPLOYING


def test_stage_not_active_in_time_rolls_back():
    sim = SimFleet(n=2, stuck=("edge-1", "edge-2"))
    run = drive(spec(deploy_timeout_s=20.0), sim)
    reason = rollback_reason(run)
    assert "stage 1/3 (10%) not active within 20 s" in reason
    assert "reports active 1, standby none" in reason
    assert 20 <= run.seconds <= 21


def test_marginal_regression_is_suspect_and_holds_the_stage():
    # +3 pt errors at a 10% canary: past the threshold, but ~120 requests cannot prove it
    sim = SimFleet(n=2, rps=10.0, behaviours={"2": Behaviour(error_rate=0.035)})
    run = drive(spec(max_soak_s=60.0, min_requests=50), sim, until_s=120)
    assert run.state.phase is Phase.PAUSED, run.reasons
    reason = run.reasons[-1]
    assert "after 60 s, error rate" in reason and "not yet significant" in reason
    assert "holding (insufficient_data=hold)" in reason
    assert any(v.outcome is Outcome.SUSPECT for v in run.state.verdicts)


# -- not enough data ---------------------------------------------------------------------


def test_insufficient_data_holds_by_default_and_says_so():
    sim = SimFleet(n=2, rps=1.0)
    run = drive(spec(), sim, until_s=200)
    assert run.state.phase is Phase.PAUSED and run.state.paused_from is Phase.SOAKING
    reason = run.reasons[-1]
    assert "after 90 s, insufficient data" in reason and "need 100 each" in reason
    assert "holding (insufficient_data=hold)" in reason
    # held: the canary keeps its share, nothing else moves
    assert run.decisions[-1].share == pytest.approx(0.1)
    assert run.state.history[-1].at - run.state.history[-2].at == pytest.approx(90)


@pytest.mark.parametrize("policy, phase, stage", [("promote", Phase.DEPLOYING, 1),
                                                  ("rollback", Phase.ROLLED_BACK, 0)])
def test_insufficient_data_policies(policy, phase, stage):
    sim = SimFleet(n=2, rps=1.0)
    sp = spec(insufficient_data=policy, max_soak_s=40.0)
    run = drive(sp, sim, until_s=45)
    moved = next(t for t in run.state.history if t.from_phase is Phase.SOAKING)
    assert moved.to_phase is phase and moved.stage == stage
    assert f"insufficient_data={policy}" in moved.reason
    assert moved.at - run.state.history[1].at == pytest.approx(40)


# -- operator actions --------------------------------------------------------------------


def run_until(sp, sim, state, phase, limit=300):
    for _ in range(limit):
        d = step(sp, state, sim.snapshot())
        sim.apply(d.assignments)
        state = d.state
        if state.phase is phase:
            return state
        sim.advance(1.0)
    raise AssertionError(f"never reached {phase}: {state.phase}")


def test_pause_freezes_and_resume_restarts_the_stage():
    sp, sim = spec(), SimFleet(n=2, behaviours={"2": Behaviour(error_rate=0.3)})
    state = run_until(sp, sim, RolloutState.start(sim.now), Phase.SOAKING)
    state = pause(sp, state, sim.now, "investigating an alert")
    assert state.phase is Phase.PAUSED and state.reason == "investigating an alert"
    for _ in range(400):  # a bad version, long past soak and deploy timeout: nothing moves
        d = step(sp, state, sim.snapshot())
        assert d.transitions == () and d.share == pytest.approx(0.1)
        sim.apply(d.assignments)
        state = d.state
        sim.advance(1.0)
    state = resume(sp, state, sim.now)
    assert state.phase is Phase.DEPLOYING and state.stage == 0
    assert state.history[-1].reason.startswith("resumed by operator; stage 1/3 (10%)")
    run = drive(sp, sim, state)
    assert "error rate" in rollback_reason(run)


def test_install_failure_rolls_back_even_when_paused():
    sp, sim = spec(), SimFleet(n=2)
    state = step(sp, RolloutState.start(sim.now), sim.snapshot()).state
    state = pause(sp, state, sim.now)
    canary = canary_order("fmnist-medium", "2", ["edge-1", "edge-2"])[0]
    sim.node(canary).failures["2"] = "verification failed: signature by unknown key"
    d = step(sp, state, sim.snapshot())
    assert d.state.phase is Phase.ROLLED_BACK and d.state.paused_from is None
    assert "signature by unknown key" in d.state.reason


def test_install_failure_counts_only_on_nodes_asked_to_hold_the_version():
    sp, sim = spec(), SimFleet(n=2)
    canary = canary_order("fmnist-medium", "2", ["edge-1", "edge-2"])[0]
    other = "edge-2" if canary == "edge-1" else "edge-1"
    sim.node(other).failures["2"] = "stale failure of an earlier attempt"
    state = RolloutState.start(sim.now)
    for _ in range(20):
        d = step(sp, state, sim.snapshot())
        state = d.state
        assert state.phase in (Phase.DEPLOYING, Phase.SOAKING)  # other was not asked (10%)
        sim.apply([a for a in d.assignments if a.node_id == canary])
        sim.advance(1.0)


def test_resume_from_paused_pending_goes_back_to_pending():
    sp = spec()
    state = pause(sp, RolloutState.start(0.0), 1.0)
    assert resume(sp, state, 2.0).phase is Phase.PENDING


def test_manual_promote_walks_the_stages_and_skips_gates():
    sp, sim = spec(), SimFleet(n=2, behaviours={"2": Behaviour(error_rate=0.3)})
    state = run_until(sp, sim, RolloutState.start(sim.now), Phase.DEPLOYING)
    state = promote(sp, state, sim.now, "operator: known-good")
    assert (state.phase, state.stage) == (Phase.DEPLOYING, 1)
    assert state.reason.startswith("operator: known-good (gates skipped); stage 2/3 (50%)")
    state = promote(sp, pause(sp, state, sim.now), sim.now)
    assert (state.phase, state.stage, state.paused_from) == (Phase.DEPLOYING, 2, None)
    state = promote(sp, state, sim.now)
    assert state.phase is Phase.PROMOTED
    assert all(a.version == "2" for a in assignments_for(sp, state, sim.snapshot()))
    with pytest.raises(RolloutError, match="promoted"):
        promote(sp, state, sim.now)
    with pytest.raises(RolloutError, match="promoted"):
        pause(sp, state, sim.now)


def test_manual_promote_from_pending_starts_the_first_stage():
    state = promote(spec(), RolloutState.start(0.0), 1.0)
    assert (state.phase, state.stage) == (Phase.DEPLOYING, 0)


def test_manual_rollback_from_anywhere_live_and_after_promotion():
    sp, sim = spec(), SimFleet(n=2)
    state = run_until(sp, sim, RolloutState.start(sim.now), Phase.SOAKING)
    back = rollback(sp, state, sim.now, "customer complaint")
    assert back.phase is Phase.ROLLED_BACK
    assert back.reason == "customer complaint: back to fmnist-medium 1"
    done = drive(sp, SimFleet(n=2)).state
    again = rollback(sp, done, 5.0)
    assert again.phase is Phase.ROLLED_BACK
    sim = SimFleet(n=2)
    assert all(a.version == "1" for a in assignments_for(sp, again, sim.snapshot()))
    with pytest.raises(RolloutError, match="rolled_back"):
        rollback(sp, again, 6.0)
    with pytest.raises(RolloutError, match="only a paused"):
        resume(sp, state, 6.0)


def test_no_nodes_in_the_tier_fails():
    sp = spec(tier=Tier.DEVICE)
    d = step(sp, RolloutState.start(0.0), SimFleet(n=2).snapshot())
    assert d.state.phase is Phase.FAILED and "no device nodes" in d.state.reason
    assert d.assignments == () and d.share == 0.0


# -- counter resets, determinism, persistence ---------------------------------------------


def test_node_restart_mid_soak_is_not_a_false_alarm():
    sp = spec(soak_s=60.0)
    canary = canary_order("fmnist-medium", "2", ["edge-1", "edge-2"])[0]

    def hook(sim, state):
        if state.phase is Phase.SOAKING and sim.now - state.phase_started_at == 30:
            sim.restart(canary)
            sim.restart("edge-2" if canary == "edge-1" else "edge-1")

    run = drive(sp, SimFleet(n=2), hook=hook)
    assert run.state.phase is Phase.PROMOTED
    for d in run.decisions:
        for v in d.verdicts:
            assert v.value is None or v.value >= 0


def test_window_after_reset_counts_only_since_restart():
    sp, sim = spec(soak_s=1000.0), SimFleet(n=2, behaviours={"2": Behaviour(error_rate=0.3)})
    state = run_until(sp, sim, RolloutState.start(sim.now), Phase.SOAKING)
    sim.advance(10)
    for n in sim.nodes:
        n.counters.clear()  # every node restarts
    sim.advance(5)
    d = step(replace(sp, fail_fast=True), state, sim.snapshot())
    err = {v.gate: v for v in d.verdicts}["error_rate"]
    assert err.outcome is Outcome.INSUFFICIENT  # 20 requests since the restart, not 60
    assert "20 requests on the new version" in err.reason


def test_same_inputs_same_decisions_whatever_the_node_order():
    def once(seed):
        sim = SimFleet(n=5, behaviours={"2": Behaviour(escalation_rate=0.3)})
        run = drive(spec(), sim, shuffle=random.Random(seed))
        return [json.dumps(d.state.to_dict(), sort_keys=True) for d in run.decisions]

    assert once(1) == once(2) == once(3)


def test_persisting_state_as_json_each_step_changes_nothing():
    plain = drive(spec(), SimFleet(n=3)).state
    stored = drive(spec(), SimFleet(n=3), persist=True).state
    assert stored == plain
    assert stored.phase is Phase.PROMOTED


def test_property_random_fleets_healthy_promotes_bad_rolls_back_within_canary():
    rng = random.Random(5)
    for _ in range(6):
        n = rng.randint(1, 12)
        canary = rng.choice([0.05, 0.1, 0.2])
        sp = spec(stages=default_stages(canary), soak_s=20.0, min_requests=50)
        good = drive(sp, SimFleet(n=n, rps=rng.uniform(15, 40)))
        assert good.state.phase is Phase.PROMOTED, good.reasons
        bad = drive(sp, SimFleet(n=n, rps=rng.uniform(15, 40),
                                 behaviours={"2": Behaviour(error_rate=0.25)}))
        assert bad.state.phase is Phase.ROLLED_BACK
        assert max(bad.max_share_by_stage.values()) == pytest.approx(canary)


# -- spec -------------------------------------------------------------------------------


def test_spec_json_round_trip_and_defaults():
    sp = spec(gates=Gates(max_psi=0.2), insufficient_data="rollback", max_soak_s=99.0)
    assert RolloutSpec.from_dict(json.loads(json.dumps(sp.to_dict()))) == sp
    minimal = RolloutSpec.from_dict({"name": "m", "version": 2, "previous": 1, "tier": "edge"})
    assert minimal.version == "2" and minimal.stages == (0.1, 0.5, 1.0)
    assert minimal.gates == Gates() and minimal.insufficient_data == "hold"
    assert minimal.soak_limit_s == 180.0


@pytest.mark.parametrize("change, words", [
    ({"stages": (0.5, 0.1, 1.0)}, "stages"),
    ({"stages": (0.1, 0.5)}, "stages"),
    ({"stages": ()}, "stages"),
    ({"version": "1"}, "already the previous"),
    ({"name": ""}, "name"),
    ({"soak_s": -1.0}, "soak_s"),
    ({"min_requests": 0}, "min_requests"),
    ({"max_soak_s": 10.0}, "max_soak_s"),
    ({"insufficient_data": "wait"}, "insufficient_data"),
])
def test_spec_validation_names_the_field(change, words):
    with pytest.raises(ConfigError, match=words):
        spec(**change)


def test_spec_from_dict_errors():
    with pytest.raises(ConfigError, match="unknown field"):
        RolloutSpec.from_dict({"name": "m", "version": "2", "previous": "1", "tier": "edge",
                               "soak": 5})
    with pytest.raises(ConfigError, match="missing"):
        RolloutSpec.from_dict({"name": "m"})
    with pytest.raises(ConfigError, match="tier"):
        RolloutSpec.from_dict({"name": "m", "version": "2", "previous": "1", "tier": "moon"})


def test_state_from_dict_rejects_damage():
    with pytest.raises(ConfigError, match="malformed"):
        RolloutState.from_dict({"phase": "exploded"})


def test_default_stages():
    assert default_stages(0.1) == (0.1, 0.5, 1.0)
    assert default_stages(0.5) == (0.5, 1.0)
    assert default_stages(1.0) == (1.0,)
    with pytest.raises(ConfigError):
        default_stages(0)


def test_describe_is_one_readable_line():
    sp, sim = spec(), SimFleet(n=2)
    state = RolloutState.start(sim.now)
    assert describe(sp, state, sim.now) == "fmnist-medium 1 -> 2 on edge: pending — created"
    state = run_until(sp, sim, state, Phase.SOAKING)
    line = describe(sp, state, state.phase_started_at + 12)
    assert line.startswith("fmnist-medium 1 -> 2 on edge: stage 1/3 (10%) soaking 12 s of 30 s")
    done = drive(sp, sim, state).state
    assert "promoted" in describe(sp, done, sim.now) and "\n" not in describe(sp, done, sim.now)
