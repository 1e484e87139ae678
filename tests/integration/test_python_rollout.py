"""A new version of a user's Python model rolled out to a fleet, as an operator does it with
the CLI: imported and published signed in one command (``model import --control --key``),
rolled out to a tier, installed into the node's slot from the repository and served by the
Python runtime — no ONNX at any step."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
import pytest

import byo_support as byo

from .integration_support import infer, running_fleet, tierlink, wait_for

pytestmark = pytest.mark.integration

FLEET = """
name: itest-python-rollout
seed: 3
control: {ttl_s: 3}
trusted_keys: [%s]
routing: {policy: tierlink}
nodes:
  - {id: edge-1, tier: edge, models: [toy-py]}
"""


def test_a_python_models_new_version_is_rolled_out_and_served(tmp_path: Path,
                                                               http: httpx.Client) -> None:
    from tierlink.cli.models import fleet_models

    saved = os.environ.get("TIERLINK_HOME")
    os.environ["TIERLINK_HOME"] = str(tmp_path / "home")  # the CLI and the nodes inherit it
    try:
        key = tmp_path / "publisher.key"
        public = tierlink("model", "keygen", "--out", str(key)).strip().splitlines()[-1]
        x, y = byo.classification_data()
        data = str(byo.save_npz(tmp_path / "toy.npz", x=x, y=y))
        tierlink("model", "import", "toy-py", str(byo.python_classifier(tmp_path / "v1")),
                 "--task", "toy", "--tier", "edge", "--data", data)
        models = fleet_models("test", ("toy-py",), progress=False)
        with running_fleet(FLEET % public, tmp_path / "fleet", models) as fleet:
            edge, url = fleet.node_urls["edge-1"], fleet.control_url
            before = http.get(f"{edge}/v2/models/toy-py").json()
            tierlink("model", "import", "toy-py",  # version 2: the same answers, surer
                     str(byo.python_classifier(tmp_path / "v2", scale=2.0)), "--task", "toy",
                     "--tier", "edge", "--data", data, "--version", "2", "--control", url,
                     "--key", str(key), "--notes", "weights doubled", token=fleet.admin_token)
            tierlink("rollout", "start", "toy-py", "2", "--tier", "edge", "--stages", "1",
                     "--soak", "1s", "--control", url, token=fleet.admin_token)
            wait_for(lambda: http.get(f"{edge}/v2/models/toy-py").json()["versions"] == ["2"]
                     or None, 120, "edge-1 serving toy-py version 2")
            meta = http.get(f"{edge}/v2/models/toy-py/versions/2").json()
            features = byo.features(5, seed=4)
            answer = infer(http, edge, "toy-py", features, input_name="x")
    finally:
        if saved is None:
            os.environ.pop("TIERLINK_HOME", None)
        else:
            os.environ["TIERLINK_HOME"] = saved
    assert before["versions"] == ["1"] and before["platform"] == "python"
    assert meta["platform"] == "python"
    assert answer.status == 200, answer.error
    np.testing.assert_allclose(answer.outputs["logits"],
                               2.0 * (features @ byo.W_CLS + byo.B_CLS), rtol=1e-5, atol=1e-5)
