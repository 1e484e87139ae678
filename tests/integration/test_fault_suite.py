"""The fault suite's cases (issue 5) on real fleets, shortened: the same code as
``benchmarks/faults.py`` (loaded from there, so the benchmark and its tests cannot drift
apart), with the time scale of the long cases cut and the issue's expectations asserted.

kill -9 an edge and restart the control plane are tested in test_kill_edge.py and
test_control_down.py with more detail; here: store-and-forward through an uplink cut with a
device killed during it, bad canaries rolled back, tampered artifacts refused, a slow node
hedged.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tierlink.models.data import Labelled

from .integration_support import Models

pytestmark = pytest.mark.integration

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "faults.py"


@pytest.fixture(scope="module")
def faults() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tierlink_fault_suite", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["sqlite", "etcd"])
def bench(request: pytest.FixtureRequest, faults: ModuleType, zoo_models: Models,
          fmnist_test: Labelled, hard_samples: np.ndarray, tmp_path: Path) -> Any:
    """A case on a SQLite control plane, and (where the store has a part) on two replicas
    over etcd."""
    b = faults.Bench(zoo_models, fmnist_test.input, fmnist_test.labels, hard_samples,
                     tmp_path, rate=20.0, control_down_s=2.0, profile="test", scale=0.4,
                     control=request.param)
    yield b
    b.http.close()


def test_uplink_cut_with_a_device_killed_delivers_every_result_once(
        faults: ModuleType, bench: Any) -> None:
    result = faults.uplink_cut(bench)
    assert result["queued"] > 100
    assert result["accepted_while_down"] > 0, result  # the devices kept answering
    assert result["lost"] == 0 and result["delivered"] == result["queued"], result
    # Redeliveries may happen (the device was killed mid-batch); the store keeps one each.
    assert result["duplicates"] == 0, result


# A version that cannot load is refused by the nodes before the store is asked anything
# new; the rollout's record on etcd (one live rollout, the leader) is tested in
# tests/control/test_control_etcd_rollouts.py (SQLite only here).
@pytest.mark.parametrize("bench", ["sqlite"], indirect=True)
def test_a_canary_that_cannot_load_is_rolled_back_at_once(faults: ModuleType,
                                                          bench: Any) -> None:
    result = faults.bad_canary_crash(bench)
    assert result["phase"] == "rolled_back", result
    assert "install" in result["reason"] or "load" in result["reason"], result
    assert result["exposed_requests"] == 0
    assert result["failed"] == 0, result


# The quality gates are the rollout controller's own; on etcd the rollout's record and the
# leader that drives it are tested in tests/control/test_control_etcd_rollouts.py (SQLite
# only here).
@pytest.mark.parametrize("bench", ["sqlite"], indirect=True)
def test_a_canary_that_loses_accuracy_is_rolled_back_within_its_share(
        faults: ModuleType, bench: Any) -> None:
    result = faults.bad_canary_accuracy(bench)
    assert result["phase"] == "rolled_back", result
    # Whichever quality gate is significant first: accuracy on the labelled feedback or the
    # drift of the confidence distribution (noisy weights move both).
    assert "accuracy" in result["reason"] or "confidence drift" in result["reason"], result
    assert result["exposed_share"] <= result["canary_share"] * 1.5, result


# Signatures are checked by the control plane's code and each node's, over whatever store
# holds the artifacts' records (SQLite only).
@pytest.mark.parametrize("bench", ["sqlite"], indirect=True)
def test_tampered_artifacts_are_refused_everywhere(faults: ModuleType, bench: Any) -> None:
    result = faults.tampered(bench)
    assert result["control_plane_refused"] == {"forged_signature": True,
                                               "untrusted_key": True}, result
    assert result["refused"] == result["nodes"] == 2, result
    assert result["rollout"]["phase"] == "rolled_back", result
    for versions in result["serving_after"].values():
        assert "3-flipped" not in versions, result


# The devices route around a killed edge by their own breakers and retries; the registry's
# lease expiry on etcd is tested in tests/control/test_control_etcd_store.py (SQLite only).
@pytest.mark.parametrize("bench", ["sqlite"], indirect=True)
def test_killing_an_edge_under_load_loses_nothing(faults: ModuleType, bench: Any) -> None:
    result = faults.kill_edge(bench)
    assert result["requests"] > 200
    assert result["lost"] == 0, result
    assert result["recovery_s"] < 5.0, result


def test_restarting_the_control_plane_under_load_fails_nothing(faults: ModuleType,
                                                               bench: Any) -> None:
    result = faults.control_restart(bench)
    assert result["failed"] == 0, result
    assert result["nodes_back"] == 4, result  # every node registered again by itself


# Hedging is the nodes' own: the control plane's store has no part in it (SQLite only).
@pytest.mark.parametrize("bench", ["sqlite"], indirect=True)
def test_a_slow_node_keeps_p99_within_the_deadline(faults: ModuleType, bench: Any) -> None:
    result = faults.slow_node(bench)
    assert result["p99_ms"] <= result["deadline_ms"], (
        f"p99 {result['p99_ms']} ms; slowest (sent at s, ms): {result['worst']}; "
        f"slow node {result['slow']}; hedges {result['hedges']}")
    assert result["extra_load_share"] <= 0.05 + 0.01, result  # the hedge budget (+ rounding)
