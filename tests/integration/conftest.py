"""Fixtures of the integration tests: real fleets (control plane, link emulator, node
processes) on loopback, built from the small ``test`` zoo and real Fashion-MNIST images.

* ``zoo_models`` (session): the ``test`` profile zoo, built once (< 1 min) and cached under
  ``$TIERLINK_HOME/zoo/test``; a dict model name -> (onnx path, card path).
* ``fmnist_test`` (session): the Fashion-MNIST test split (``images`` (N, 1, 28, 28) float32,
  ``labels`` (N,) int64).
* ``hard_samples`` (session): indices of test images the device model is unsure of.
* ``shared_fleet`` (package): one fleet of ``SHARED_FLEET`` for the tests that only send
  requests and read metrics. Tests that kill or stop processes start their own with
  ``start_fleet``.
* ``start_fleet`` (function): ``start_fleet(yaml_text)`` launches a fleet into ``tmp_path``;
  every fleet is stopped at teardown and its processes must all be gone.
* ``http`` (function): a ``httpx.Client`` for loopback calls.

A failed test's report carries, as a section ``fleet logs``, the warnings, errors and failures
its fleets' processes logged (the last of them per process): what a node saw is in the CI
output, not only in a run directory the CI machine throws away.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import Models, least_confident, least_confident_of_all, running_fleet

# 1 cloud, 2 edges, 2 devices under a CPU quota (as in the demo's fleet.yaml; unthrottled where
# cgroups are unavailable); short links so the tests spend their time routing, not waiting.
# Cascade thresholds are high for the weak `test` models: most answers escalate.
SHARED_FLEET = """
name: itest-shared
seed: 11
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.9, fmnist-medium: 0.9}
  breaker: {failure_threshold: 3, cooldown_s: 1}
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium]}
  - {id: edge-2,  tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,   tier: device, models: [fmnist-small], cpu_quota: 0.5}
  - {id: dev-2,   tier: device, models: [fmnist-small], cpu_quota: 0.5}
links:
  - {from: [dev-1, dev-2], to: [edge-1, edge-2], delay_ms: 2}
  - {from: [edge-1, edge-2], to: cloud-1, delay_ms: 10}
"""


# Per test item: the run directories of the fleets it used (see the module doc).
FLEET_DIRS = pytest.StashKey[list[Path]]()
SHARED_DIRS: list[Path] = []  # the shared fleet's, while it runs
NOTABLE = re.compile(r" (WARNING|ERROR|CRITICAL) |failed|Traceback")
LOG_LINES = 15  # per process


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        shared = SHARED_DIRS if "shared_fleet" in getattr(item, "fixturenames", ()) else []
        excerpt = fleet_log_excerpt([*item.stash.get(FLEET_DIRS, []), *shared])
        if excerpt:
            report.sections.append(("fleet logs", excerpt))


def fleet_log_excerpt(run_dirs: list[Path]) -> str:
    """The notable lines of every process log under ``run_dirs`` (the last ``LOG_LINES``
    of each)."""
    parts = []
    for log in sorted(p for d in run_dirs for p in (d / "logs").glob("*.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if NOTABLE.search(line)]
        if lines:
            parts.append(f"== {log.parent.parent.name}/{log.name}\n"
                         + "\n".join(lines[-LOG_LINES:]))
    return "\n".join(parts)


def remember_fleet(request: pytest.FixtureRequest, run_dir: Path) -> None:
    request.node.stash.setdefault(FLEET_DIRS, []).append(run_dir)


@pytest.fixture(scope="session")
def zoo_models() -> Models:
    from tierlink.errors import ZooError
    from tierlink.zoo.cache import ensure_zoo
    from tierlink.zoo.datasets import DEFAULT_ROOT, INSTALL_HINT

    if not DEFAULT_ROOT.is_dir():
        pytest.skip(f"Fashion-MNIST is not installed ({INSTALL_HINT})")
    try:
        zoo = ensure_zoo(task="fmnist", profile="test", progress=False)
    except ZooError as exc:
        pytest.fail(f"cannot build the test zoo: {exc}")
    return {name: (zoo.path(name), zoo.card_path(name)) for name in zoo.cards}


@pytest.fixture(scope="session")
def fmnist_test() -> Labelled:
    """The test split: ``.input`` (5000, 1, 28, 28) float32 in [0, 1], ``.labels`` int64."""
    from tierlink.zoo.datasets import DEFAULT_ROOT, INSTALL_HINT, fashion_mnist

    if not DEFAULT_ROOT.is_dir():
        pytest.skip(f"Fashion-MNIST is not installed ({INSTALL_HINT})")
    return fashion_mnist().test


@pytest.fixture(scope="session")
def hard_samples(zoo_models: Models, fmnist_test: Labelled) -> np.ndarray:
    """Indices of 100 test images the device model is least sure of: a cascade escalates
    them, so requests built from them travel up the tiers."""
    return least_confident(zoo_models["fmnist-small"][0], fmnist_test.input, 100)


@pytest.fixture(scope="session")
def cloud_samples(zoo_models: Models, fmnist_test: Labelled) -> np.ndarray:
    """Indices of 20 test images that neither the device's nor the edge's model is sure of:
    a cascade through both sends them to the cloud."""
    return least_confident_of_all([zoo_models[m][0] for m in ("fmnist-small", "fmnist-medium")],
                                  fmnist_test.input, 20)


@pytest.fixture(scope="package")
def shared_fleet(zoo_models: Models, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[RunningFleet]:
    run_dir = tmp_path_factory.mktemp("shared-fleet")
    SHARED_DIRS[:] = [run_dir]
    with running_fleet(SHARED_FLEET, run_dir, zoo_models) as fleet:
        yield fleet


@pytest.fixture
def start_fleet(zoo_models: Models, tmp_path: Path, request: pytest.FixtureRequest,
                ) -> Iterator[Callable[[str], RunningFleet]]:
    """``start_fleet(yaml_text)``: a fleet of the test's own, stopped (and checked gone) at
    teardown even when the test fails."""
    with contextlib.ExitStack() as stack:
        count = 0

        def start(yaml_text: str) -> RunningFleet:
            nonlocal count
            count += 1
            run_dir = tmp_path / f"fleet-{count}"
            remember_fleet(request, run_dir)
            return stack.enter_context(running_fleet(yaml_text, run_dir, zoo_models))

        yield start


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    # trust_env=False: loopback calls must not go through a proxy from the environment.
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        yield client
