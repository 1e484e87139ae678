"""The rollout controller on a fake clock, fed by heartbeats through the registry."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry
from rollout_support import MODEL, Behaviour, Sim, SimNode

from tierlink.control.metrics import ControlMetrics
from tierlink.control.registry import RegistryService
from tierlink.control.rollouts import RolloutController, RolloutStore
from tierlink.control.store import SqliteRegistryStore
from tierlink.errors import ConfigError, RepositoryError, RolloutError, RolloutNotFound

FAST = {"soak_s": 10, "min_requests": 50, "deploy_timeout_s": 30}


@dataclass
class Env:
    db: Path
    registry: RegistryService
    store: RolloutStore
    controller: RolloutController
    metrics: CollectorRegistry
    clock: Any

    def sim(self, *nodes: SimNode) -> Sim:
        sim = Sim(list(nodes), self.registry, self.controller, self.clock)
        sim.beat()
        return sim

    def start(self, **fields: Any) -> dict[str, Any]:
        body = {"name": MODEL, "version": "2", "tier": "edge", "canary": 0.1, **FAST}
        return self.controller.start({**body, **fields})

    def phase(self, rollout_id: int) -> str:
        return str(self.controller.get(rollout_id)["phase"])

    def transitions(self, frm: str, to: str) -> float:
        value = self.metrics.get_sample_value(
            "tierlink_rollout_transitions_total",
            {"model": MODEL, "from_phase": frm, "to_phase": to})
        return value or 0.0


def _controller(db: Path, registry: RegistryService, clock: Any,
                repository: Any = None) -> tuple[RolloutController, CollectorRegistry]:
    metrics = CollectorRegistry()
    return RolloutController(RolloutStore(db), registry, clock, metrics, repository), metrics


@pytest.fixture
def env(tmp_path: Path, clock: Any) -> Iterator[Env]:
    db = tmp_path / "control.db"
    nodes = SqliteRegistryStore(db)
    registry = RegistryService(nodes, clock, 5.0, ControlMetrics.create())
    controller, metrics = _controller(db, registry, clock)
    yield Env(db, registry, controller.store, controller, metrics, clock)
    controller.store.close()
    nodes.close()


def two_edges(**behaviours: Behaviour) -> tuple[SimNode, SimNode]:
    return (SimNode("edge-1", "1", behaviours=dict(behaviours)),
            SimNode("edge-2", "1", behaviours=dict(behaviours)))


def test_a_canary_of_10_percent_on_two_nodes_is_one_node_at_weight_0_2(env: Env) -> None:
    env.sim(*two_edges())
    record = env.start()
    assert record["phase"] == "deploying" and record["spec"]["previous"] == "1"
    moved = [a for a in record["assignments"] if a["version"] == "2"]
    assert len(moved) == 1 and moved[0]["weight"] == pytest.approx(0.2)
    assert record["share"] == pytest.approx(0.1)
    canary = moved[0]["node_id"]
    other = "edge-2" if canary == "edge-1" else "edge-1"
    assert env.controller.desired_for(canary) == {MODEL: {"version": "2", "weight": 0.2}}
    assert env.controller.desired_for(other) == {MODEL: {"version": "1", "weight": 1.0}}
    assert env.controller.desired_for("cloud-1") == {}
    assert env.transitions("pending", "deploying") == 1


def test_good_stats_promote_stage_by_stage(env: Env) -> None:
    sim = env.sim(*two_edges(**{"2": Behaviour(accuracy=0.92)}))
    rollout_id = env.start()["id"]
    sim.run_until(lambda: env.phase(rollout_id) == "promoted")
    record = env.controller.get(rollout_id)
    path = [(t["from"], t["to"]) for t in record["transitions"]]
    assert path.count(("deploying", "soaking")) == 3  # 10%, 50%, 100%
    assert path[-1] == ("soaking", "promoted") and record["share"] == 1.0
    assert all(n.active == "2" for n in sim.nodes)
    assert env.controller.desired_for("edge-1") == {MODEL: {"version": "2", "weight": 1.0}}
    assert env.transitions("soaking", "promoted") == 1
    assert "passed every gate" in record["transitions"][-1]["reason"]


def test_lower_feedback_accuracy_rolls_back_with_the_reason(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    sim = env.sim(*two_edges(**{"2": Behaviour(accuracy=0.75)}))
    rollout_id = env.start(soak_s=30)["id"]
    with caplog.at_level(logging.INFO, logger="tierlink.control.rollouts"):
        sim.run_until(lambda: env.phase(rollout_id) == "rolled_back")
    record = env.controller.get(rollout_id)
    reason = record["transitions"][-1]["reason"]
    assert "accuracy on labelled feedback" in reason
    assert any(v["gate"] == "feedback_accuracy" and v["outcome"] == "fail"
               for v in record["transitions"][-1]["verdicts"])
    rollbacks = [r for r in caplog.records if "rolled_back" in r.getMessage()]
    assert rollbacks and all(r.levelno == logging.WARNING for r in rollbacks)
    sim.run_until(lambda: all(n.active == "1" and n.weight == 0 for n in sim.nodes), 5)
    for node in ("edge-1", "edge-2"):  # still answered after the rollout ended
        assert env.controller.desired_for(node) == {MODEL: {"version": "1", "weight": 1.0}}


def test_an_install_failure_rolls_back_naming_node_and_error(env: Env) -> None:
    nodes = two_edges()
    for node in nodes:
        node.broken["2"] = "signature by an untrusted key"
    sim = env.sim(*nodes)
    rollout_id = env.start()["id"]
    sim.run_until(lambda: env.phase(rollout_id) == "rolled_back", 5)
    reason = env.controller.get(rollout_id)["transitions"][-1]["reason"]
    assert "failed to install" in reason and "signature by an untrusted key" in reason
    assert env.transitions("deploying", "rolled_back") == 1
    sim.round()  # desired no longer asks for "2": the nodes stop reporting the failure
    assert all(not n.failures for n in sim.nodes)


def test_a_new_controller_over_the_same_db_resumes(env: Env) -> None:
    sim = env.sim(*two_edges())
    rollout_id = env.start()["id"]
    sim.run_until(lambda: env.phase(rollout_id) == "soaking")
    before = {n: env.controller.desired_for(n) for n in ("edge-1", "edge-2")}
    env.controller.store.close()  # the control plane restarts
    controller, _ = _controller(env.db, env.registry, env.clock)
    env.controller = sim.controller = controller
    try:
        assert {n: controller.desired_for(n) for n in before} == before
        assert env.phase(rollout_id) == "soaking"
        sim.run_until(lambda: env.phase(rollout_id) == "promoted")
    finally:
        env.store = controller.store


def test_one_live_rollout_per_model(env: Env) -> None:
    env.sim(*two_edges())
    first = env.start()["id"]
    with pytest.raises(RolloutError, match="already has a live rollout") as info:
        env.start(version="3")
    assert info.value.http_status == 409 and str(first) in info.value.message
    env.controller.act(first, "rollback", "wrong build")
    assert env.start(version="3")["phase"] == "deploying"


def test_start_refusals(env: Env) -> None:
    with pytest.raises(RolloutError, match="no alive edge node serves") as info:
        env.start()
    assert "tierlink model list" in info.value.hint
    env.sim(SimNode("edge-1", "1"), SimNode("edge-2", "0"))
    with pytest.raises(RolloutError, match="disagree"):
        env.start()
    with pytest.raises(ConfigError, match="stages or canary"):
        env.start(previous="1", stages=[0.5, 1.0])
    with pytest.raises(ConfigError, match="already the previous"):
        env.start(previous="2")
    with pytest.raises(ConfigError, match="gates: unknown"):
        env.start(previous="1", gates={"max_p99": 2})
    assert env.start(previous="1")["spec"]["previous"] == "1"


def test_previous_defaults_to_the_majority_active_version(env: Env) -> None:
    env.sim(SimNode("edge-1", "1"), SimNode("edge-2", "1"), SimNode("edge-3", "0"),
            SimNode("cloud-1", "7", tier="cloud"))
    assert env.start()["spec"]["previous"] == "1"


class _Repository:
    """Stands in for RepositoryService: only version 2 is published."""

    def version(self, name: str, version: str) -> object:
        if (name, version) != (MODEL, "2"):
            raise RepositoryError(f"{name} version {version} is not published")
        return object()


def test_only_published_versions_roll_out(env: Env) -> None:
    env.controller.store.close()
    controller, _ = _controller(env.db, env.registry, env.clock, cast(Any, _Repository()))
    env.controller = controller
    env.sim(*two_edges())
    with pytest.raises(RepositoryError) as info:
        env.start(version="9")
    assert info.value.http_status == 404
    assert env.start()["phase"] == "deploying"


def test_operator_actions(env: Env) -> None:
    sim = env.sim(*two_edges())
    rollout_id = env.start()["id"]
    sim.run_until(lambda: env.phase(rollout_id) == "soaking")
    paused = env.controller.act(rollout_id, "pause", "investigating")
    assert paused["phase"] == "paused" and "investigating" in paused["describe"]
    for _ in range(40):  # paused: no timer runs, assignments stay
        sim.round()
    assert env.phase(rollout_id) == "paused"
    with pytest.raises(RolloutError, match="cannot pause"):
        env.controller.act(rollout_id, "pause")
    assert env.controller.act(rollout_id, "resume")["phase"] == "deploying"
    promoted = env.controller.act(rollout_id, "promote")
    assert promoted["state"]["stage"] == 1 and promoted["share"] == pytest.approx(0.5)
    assert env.controller.act(rollout_id, "promote")["share"] == 1.0
    assert env.controller.act(rollout_id, "promote")["phase"] == "promoted"
    back = env.controller.act(rollout_id, "rollback", "customer complaints")
    assert back["phase"] == "rolled_back" and "customer complaints" in back["describe"]
    assert env.controller.desired_for("edge-1") == {MODEL: {"version": "1", "weight": 1.0}}
    with pytest.raises(RolloutNotFound):
        env.controller.act(999, "pause")
    with pytest.raises(RolloutNotFound):
        env.controller.act(rollout_id, "explode")


def test_only_the_latest_rollout_of_a_model_can_be_rolled_back(env: Env) -> None:
    env.sim(*two_edges())
    old = env.start()["id"]
    env.controller.act(old, "rollback")
    env.start(version="3")
    with pytest.raises(RolloutError, match="not the latest"):
        env.controller.act(old, "rollback")


def test_malformed_stats_are_skipped_not_fatal(env: Env,
                                               caplog: pytest.LogCaptureFixture) -> None:
    sim = env.sim(*two_edges())
    rollout_id = env.start()["id"]
    sim.nodes[0].bad_stats = True
    with caplog.at_level(logging.WARNING, logger="tierlink.control.rollouts"):
        for _ in range(3):
            sim.round()
    warned = [r for r in caplog.records if "malformed version stats" in r.getMessage()]
    assert len(warned) == 2  # once per (node, version), not every tick
    assert env.phase(rollout_id) in ("deploying", "soaking")


def test_records_are_listed_newest_first(env: Env) -> None:
    env.sim(*two_edges())
    first = env.start()["id"]
    env.controller.act(first, "rollback")
    second = env.start(version="3")["id"]
    assert [r["id"] for r in env.controller.records()] == [second, first]
    assert [r["id"] for r in env.controller.records("other")] == []
    record = env.controller.get(first)
    assert [t["to"] for t in record["transitions"]] == ["deploying", "rolled_back"]
    assert set(record) >= {"id", "spec", "state", "phase", "describe", "assignments", "share",
                           "created_at", "updated_at", "transitions"}


def test_a_silent_tier_holds_the_rollout(env: Env) -> None:
    sim = env.sim(*two_edges())
    rollout_id = env.start()["id"]
    sim.beat()  # the canary node takes the version, then the whole tier goes silent
    env.clock.advance(20)
    env.controller.tick()  # with nobody to ask, a stage does not count as deployed
    assert env.phase(rollout_id) == "deploying"
    assert env.controller.desired_for("edge-1") != {}  # still answered
    sim.run_until(lambda: env.phase(rollout_id) == "soaking", 5)


def test_a_damaged_stored_rollout_is_skipped_and_the_others_go_on(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    good = {"2": Behaviour(accuracy=0.92)}
    sim = env.sim(*two_edges(**good), SimNode("cloud-1", "1", tier="cloud", behaviours=good))
    first = env.start()["id"]
    sim.run_until(lambda: env.phase(first) == "promoted")
    second = env.start(tier="cloud")["id"]
    db = sqlite3.connect(env.db)
    with db:
        db.execute("UPDATE rollouts SET state = '{broken' WHERE id = ?", (first,))
    db.close()
    with caplog.at_level(logging.ERROR, logger="tierlink.control.rollouts"):
        sim.run_until(lambda: env.phase(second) == "promoted")
    said = [r for r in caplog.records if f"stored rollout {first} is damaged" in r.getMessage()]
    assert len(said) == 1  # once, not every tick
    # The damaged one stays as last published: its nodes keep what they were told.
    assert env.controller.desired_for("edge-1") == {MODEL: {"version": "2", "weight": 1.0}}
    assert env.controller.desired_for("cloud-1") == {MODEL: {"version": "2", "weight": 1.0}}
    restarted, _ = _controller(env.db, env.registry, env.clock)  # a restart still starts
    try:
        assert restarted.desired_for("cloud-1") == {MODEL: {"version": "2", "weight": 1.0}}
        assert restarted.desired_for("edge-1") == {}  # nothing published for it since
    finally:
        restarted.store.close()


def test_cohort_by_cohort_and_a_failing_cohort_rolls_back_alone(env: Env) -> None:
    """Version 2 is good on hardware a and wrong on b: the hw=a cohort is promoted, then
    the hw=b cohort starts, fails its accuracy gate and rolls back — alone: hw=a keeps
    version 2."""
    a = SimNode("edge-1", "1", labels={"hw": "a"},
                behaviours={"2": Behaviour(accuracy=0.92)})
    b = SimNode("edge-2", "1", labels={"hw": "b"},
                behaviours={"2": Behaviour(accuracy=0.75)})
    sim = env.sim(a, b)
    first = env.start(cohorts=[{"hw": "a"}, {"hw": "b"}], soak_s=30)
    assert first["spec"]["selector"] == {"hw": "a"}
    assert [x["node_id"] for x in first["assignments"]] == ["edge-1"]
    assert env.controller.desired_for("edge-2") == {}  # not its turn
    sim.run_until(lambda: env.phase(first["id"]) == "promoted")
    second = next(r for r in env.controller.records(MODEL) if r["id"] != first["id"])
    assert second["spec"]["selector"] == {"hw": "b"} and second["spec"]["cohorts"] == []
    sim.run_until(lambda: env.phase(second["id"]) == "rolled_back")
    reason = env.controller.get(second["id"])["transitions"][-1]["reason"]
    assert "accuracy on labelled feedback" in reason
    sim.run_until(lambda: a.active == "2" and b.active == "1" and b.weight == 0, 5)
    assert env.controller.desired_for("edge-1") == {MODEL: {"version": "2", "weight": 1.0}}
    assert env.controller.desired_for("edge-2") == {MODEL: {"version": "1", "weight": 1.0}}
    assert env.phase(first["id"]) == "promoted"  # untouched by the second's rollback
    for _ in range(5):  # and nothing else starts
        sim.round()
    assert len(env.controller.records(MODEL)) == 2


def test_a_cohort_without_nodes_is_refused_and_bad_cohorts_are_config_errors(
        env: Env) -> None:
    env.sim(SimNode("edge-1", "1", labels={"hw": "a"}))
    with pytest.raises(RolloutError, match="labels"):
        env.start(cohorts=[{"hw": "z"}])
    with pytest.raises(ConfigError, match="cohort"):
        env.start(cohorts=[{"hw": 3}])
    with pytest.raises(ConfigError, match="not both"):
        env.start(cohorts=[{"hw": "a"}], selector={"hw": "a"})
