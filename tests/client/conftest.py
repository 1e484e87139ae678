"""Fixtures of the client tests.

* ``zoo_models`` and ``fmnist_test`` (session): the integration tests' own fixtures (the
  ``test`` profile zoo, the Fashion-MNIST test split), reused as they are.
* ``node_fleet`` (module): one real node process (``edge-1`` serving ``fmnist-medium``, the
  task ``fmnist``) and its control plane on loopback, started with the integration tests'
  ``running_fleet``: stopped at teardown, every process checked gone.
* ``images`` (session): two test images, (2, 1, 28, 28) float32.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from integration.conftest import fmnist_test, zoo_models  # noqa: F401  (fixtures, reused)
from integration.integration_support import Models, running_fleet
from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

NODE = "edge-1"
MODEL = "fmnist-medium"
TASK = "fmnist"
ONE_NODE_FLEET = f"""
name: client-tests
seed: 5
zoo: {{profile: test}}
nodes:
  - {{id: {NODE}, tier: edge, models: [{MODEL}]}}
"""


@pytest.fixture(scope="module")
def node_fleet(zoo_models: Models,  # noqa: F811  (the reused fixture, requested)
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    with running_fleet(ONE_NODE_FLEET, tmp_path_factory.mktemp("client-fleet"),
                       zoo_models) as fleet:
        yield fleet


@pytest.fixture(scope="session")
def images(fmnist_test: Labelled) -> np.ndarray:  # noqa: F811  (the reused fixture, requested)
    return np.ascontiguousarray(fmnist_test.input[:2])  # (2, 1, 28, 28) float32
