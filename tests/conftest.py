"""Fixtures shared across the test tree.

This file's folder (``tests/``) is on ``sys.path`` while tests run (pytest's default import
mode puts a rootless conftest's folder there), so tests import shared helpers at this
level by module name: ``byo_support`` (small real ONNX models and their data).

* ``model_store``: an empty local model store under ``tmp_path``, with ``TIERLINK_HOME``
  pointing there, so nothing touches the real store (``ModelStore.default()`` is it).
* ``etcd_cluster``: a real three-member etcd cluster on loopback for the whole session
  (tests keep to a key prefix of their own: ``etcd_prefix``); tests that kill members start
  their own.

In CI (``CI=true``, set by ``.ci/run``) a test that would skip -- a package, a service or a
data set missing -- fails instead, naming why: CI cannot pass by not running a test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _fail_a_skip_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_a_skip_in_ci(outcome.get_result())  # a module-level importorskip


def _fail_a_skip_in_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where nothing may be: {reason}"


@pytest.fixture
def model_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # -> ModelStore
    from tierlink.modelstore.store import ModelStore

    monkeypatch.setenv("TIERLINK_HOME", str(tmp_path / "home"))
    store = ModelStore.default()
    assert store.root == tmp_path / "home" / "models"
    return store


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory):  # -> EtcdCluster
    from tierlink.etcd.cluster import EtcdCluster

    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"), size=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix no other test uses: ``/test/<test name>/``."""
    return f"/test/{request.node.name}/".replace("[", "-").replace("]", "")
