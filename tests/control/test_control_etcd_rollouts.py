"""Rollouts on etcd: one live rollout per model across replicas, saves that cannot
overwrite another replica's change, one leader stepping them."""

from __future__ import annotations

import time

import pytest

from tierlink.control.etcd_rollouts import EtcdRolloutStore
from tierlink.core.types import Tier
from tierlink.errors import RolloutError
from tierlink.etcd.client import Etcd
from tierlink.etcd.leader import Leadership
from tierlink.rollout import RolloutSpec, RolloutState, step

pytestmark = pytest.mark.integration


@pytest.fixture
def etcd(etcd_cluster):
    with Etcd(etcd_cluster.endpoints) as client:
        yield client


def first_step(name: str = "fmnist-medium", now: float = 100.0):
    from tierlink.rollout import FleetSnapshot, NodeSnapshot

    spec = RolloutSpec(name=name, version="2", previous="1", tier=Tier.EDGE)
    fleet = FleetSnapshot(now=now, nodes=(NodeSnapshot("edge-1", Tier.EDGE, "1"),
                                          NodeSnapshot("edge-2", Tier.EDGE, "1")))
    decision = step(spec, RolloutState.start(now), fleet)
    assert not decision.state.terminal
    return spec, decision


def test_one_live_rollout_per_model_and_the_log_kept(etcd, etcd_prefix):
    a, b = EtcdRolloutStore(etcd, prefix=etcd_prefix), EtcdRolloutStore(etcd, prefix=etcd_prefix)
    spec, decision = first_step()
    created = a.create(spec, decision, 100.0)
    assert created.id == 1 and b.get(1) is not None
    with pytest.raises(RolloutError, match="already has a live rollout"):
        b.create(spec, decision, 101.0)
    other = b.create(*first_step("fmnist-large"), 102.0)
    assert other.id == 2
    current, damaged = a.current()
    assert [r.id for r in current] == [1, 2] and damaged == {}
    assert [r.id for r in a.recent("fmnist-large")] == [2]
    assert len(a.transitions(1)) == len(decision.transitions)


def test_a_save_over_another_replicas_change_is_refused(etcd, etcd_prefix):
    a, b = EtcdRolloutStore(etcd, prefix=etcd_prefix), EtcdRolloutStore(etcd, prefix=etcd_prefix)
    spec, decision = first_step()
    a.create(spec, decision, 100.0)
    seen_by_a, seen_by_b = a.get(1), b.get(1)
    assert seen_by_a is not None and seen_by_b is not None
    b.save(seen_by_b, decision, 105.0)  # an operator's action at b
    with pytest.raises(RolloutError, match="changed at another replica"):
        a.save(seen_by_a, decision, 106.0)  # a's tick read it before
    fresh = a.get(1)
    assert fresh is not None and a.save(fresh, decision, 107.0).updated_at == 107.0


def test_one_leader_and_the_next_takes_over_when_it_resigns(etcd, etcd_prefix):
    key = etcd_prefix + "leader"
    first, second = Leadership(etcd, key, "a", ttl_s=1.0), Leadership(etcd, key, "b", ttl_s=1.0)
    assert first.holds() is True and second.holds() is False
    assert first.holds() is True  # renewing
    first.resign()
    assert second.holds() is True and first.holds() is False


def test_a_silent_leader_loses_the_lead_when_its_lease_runs_out(etcd, etcd_prefix):
    key = etcd_prefix + "leader"
    first, second = Leadership(etcd, key, "a", ttl_s=1.0), Leadership(etcd, key, "b", ttl_s=1.0)
    assert first.holds()
    deadline = time.monotonic() + 6.0
    while not second.holds():  # first stops renewing (a crash)
        assert time.monotonic() < deadline, "the lead never moved"
        time.sleep(0.2)


@pytest.mark.parametrize("kind", ["etcd", "sqlite"])
def test_the_latest_rollout_of_each_cohort_is_current(etcd, etcd_prefix, kind):
    """A model's cohorts are rolled out one after another: the store keeps telling each
    cohort's nodes what its own latest rollout says (hw=a promoted, hw=b live)."""
    from dataclasses import replace

    from tierlink.control.rollouts import RolloutStore
    from tierlink.rollout import rollback

    store = EtcdRolloutStore(etcd, prefix=etcd_prefix) if kind == "etcd" \
        else RolloutStore(":memory:")
    spec, decision = first_step()
    a = store.create(replace(spec, selector={"hw": "a"}), decision, 100.0)
    ended = rollback(a.spec, decision.state, 110.0)
    store.save(a, replace(decision, state=ended), 110.0)
    b = store.create(replace(spec, selector={"hw": "b"}), decision, 120.0)
    current, _ = store.current()
    assert [(r.id, r.spec.cohort_key) for r in current] == [(a.id, "hw=a"), (b.id, "hw=b")]
    store.close()
