"""The plan cache keeps only what a decision does not owe to the request in hand: a
fixed-seed simulation makes the same decisions with it and without it, and a warm snapshot
answers most decisions from it with the same plans."""

from __future__ import annotations

import functools
import random

import pytest

import sim_support as toy
from tierlink.core.types import Privacy, Request
from tierlink.policy import PolicyConfig, TierlinkPolicy
from tierlink.policy import placement as placement_module
from tierlink.policy.plan_cache import PlanCache
from tierlink.sim.run import simulate
from tierlink.sim.workload import Arrivals, workload

RUNS = (("tierlink", None), ("bandit", "bandit"), ("cloud_only", "cloud_only"))


def _run(monkeypatch: pytest.MonkeyPatch, cache: bool) -> tuple[dict, dict]:
    monkeypatch.setattr(placement_module, "PlanCache", functools.partial(PlanCache,
                                                                         enabled=cache))
    config = toy.fleet()
    items = workload(Arrivals("constant", 40.0), 30.0, ["dev-1", "dev-2"], toy.N, seed=7)
    return simulate(config, toy.views(), toy.outcomes(), items, seed=3, runs=RUNS)


def test_a_fixed_seed_run_decides_the_same_with_the_cache_on_and_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cached, with_cache = _run(monkeypatch, True)
    plain, without = _run(monkeypatch, False)
    for name, _policy in RUNS:
        got = [(r.item.sample, r.served_by, r.tier, r.pred, r.latency_ms, r.error)
               for r in with_cache[name]]
        want = [(r.item.sample, r.served_by, r.tier, r.pred, r.latency_ms, r.error)
                for r in without[name]]
        assert got == want, name
    assert cached["runs"] == plain["runs"]
    assert plain["sim"]["tierlink"]["plan_cache"]["hit_rate"] is None  # off: never asked
    # Snapshots change often here and forwarded requests arrive with any budget left: few
    # hits, every one exact (the warm snapshot below is where the cache earns its keep).
    assert cached["sim"]["tierlink"]["plan_cache"]["hits"] > 0


def test_a_warm_snapshot_answers_from_the_cache_with_the_same_plans() -> None:
    view = toy.device_view()
    warm, cold = TierlinkPolicy(PolicyConfig()), TierlinkPolicy(PolicyConfig())
    cold.cache.enabled = False
    a, b = random.Random(5), random.Random(5)
    for i in range(300):
        req = Request(f"r{i}", "toy", (20.0, 150.0, 1000.0)[i % 3], "dev-1",
                      list(Privacy)[i % 3], input_bytes=3136)
        assert warm.plan(req, view, a) == cold.plan(req, view, b)
    assert warm.cache.hits > 250 and cold.cache.hits == 0
