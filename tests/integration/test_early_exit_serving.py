"""Early exit across real processes: a device and a cloud serve the multi-exit Fashion-MNIST
net; the device answers at its first confident exit, and a split at the exit boundary sends
on only the inputs that no exit on the device could answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink.models.data import Labelled

from .integration_support import Models, infer, metric_sum

pytestmark = pytest.mark.integration

FLEET = """
name: itest-exits
seed: 5
zoo: {profile: test}
control: {ttl_s: 3}
routing: {allow_policy_override: true}
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-exits]}
  - {id: dev-1,   tier: device, models: [fmnist-exits], heads: [fmnist-exits]}
links:
  - {from: dev-1, to: cloud-1, delay_ms: 2, bandwidth_mbit: 100}
"""


@pytest.fixture(scope="module")
def exit_models(zoo_models: Models, tmp_path_factory: pytest.TempPathFactory) -> Models:
    from tierlink.zoo.exits import ensure_exits

    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    built = ensure_exits("test", root=tmp_path_factory.mktemp("exits-zoo"))
    return {**zoo_models, "fmnist-exits": (built.whole_path, built.card_path)}


def split_params(cut: str) -> dict[str, Any]:
    return {"tierlink.privacy": "any", "tierlink.deadline_ms": 5000.0,
            "tierlink.split": f"cloud-1/{cut}/int8+zstd"}


def test_device_exits_early_and_splits_at_the_exit_boundary(
        exit_models: Models, fmnist_test: Labelled, http: httpx.Client, tmp_path: Path) -> None:
    from .integration_support import running_fleet

    x = fmnist_test.input[:24]
    with running_fleet(FLEET, tmp_path / "fleet", exit_models) as fleet:
        dev, cloud = fleet.node_urls["dev-1"], fleet.node_urls["cloud-1"]
        whole = infer(http, cloud, "fmnist-exits", x)  # the model endpoint: every sample
        assert whole.status == 200, whole.error
        exits = whole.outputs["exit"]
        assert set(exits.tolist()) <= {0, 1, 2} and (exits == 0).any()
        labels = np.exp(whole.outputs["logits"]).argmax(axis=1)
        assert metric_sum(http, cloud, "tierlink_early_exits_total") == len(x)

        _wait_for_cloud(http, dev, x[:1])
        sent = 0
        for i in range(len(x)):
            answer = infer(http, dev, "fmnist", x[i:i + 1], split_params("features1"))
            assert answer.status == 200, answer.error
            path = json.loads(answer.parameters["tierlink.path"])
            timings = json.loads(answer.parameters["tierlink.timings_ms"])
            assert answer.outputs["label"][0] == labels[i]
            if exits[i] == 0:  # exit 1 answered on the device: nothing left it
                assert path == ["dev-1"] and timings["exit"] == 0
            else:
                sent += 1
                assert path == ["dev-1", "cloud-1"] and timings["split_bytes"] > 0
        assert sent == int((exits > 0).sum())

        routed = infer(http, dev, "fmnist", x[:1], {"tierlink.privacy": "local"})
        assert routed.status == 200 and routed.parameters["tierlink.served_by"] == "dev-1"


def _wait_for_cloud(http: httpx.Client, url: str, x: np.ndarray) -> None:
    """The device must have cloud-1 in its view before a split can name it."""
    import time

    for _ in range(100):
        if infer(http, url, "fmnist", x, split_params("features1")).status == 200:
            return
        time.sleep(0.1)
    raise AssertionError("the device never split to cloud-1")


ROLLOUT_FLEET = """
name: itest-exits-rollout
seed: 5
zoo: {profile: test}
control: {ttl_s: 3}
trusted_keys: [%s]
nodes:
  - {id: cloud-1, tier: cloud, models: [fmnist-exits]}
"""


def test_a_multi_exit_models_new_version_is_rolled_out_and_served(
        exit_models: Models, fmnist_test: Labelled, http: httpx.Client, tmp_path: Path) -> None:
    """Its segments travel as one file: published signed, installed into the node's slot,
    served by the multi-exit runtime, answering as the version before it."""
    from .integration_support import running_fleet, tierlink, wait_for

    key = tmp_path / "publisher.key"
    public = tierlink("model", "keygen", "--out", str(key)).strip().splitlines()[-1]
    whole, card = exit_models["fmnist-exits"]
    x = fmnist_test.input[:16]
    with running_fleet(ROLLOUT_FLEET % public, tmp_path / "fleet", exit_models) as fleet:
        cloud, url = fleet.node_urls["cloud-1"], fleet.control_url
        before = infer(http, cloud, "fmnist-exits", x)
        tierlink("model", "publish", "fmnist-exits", str(whole), "--card", str(card),
                 "--version", "2", "--notes", "the same net, packed", "--key", str(key),
                 "--control", url, "--eval-limit", "200", token=fleet.admin_token)
        tierlink("rollout", "start", "fmnist-exits", "2", "--tier", "cloud", "--stages", "1",
                 "--soak", "1s", "--control", url, token=fleet.admin_token)
        wait_for(lambda: http.get(f"{cloud}/v2/models/fmnist-exits").json()["versions"]
                 == ["2"] or None, 120, "cloud-1 serving fmnist-exits version 2")
        meta = http.get(f"{cloud}/v2/models/fmnist-exits/versions/2").json()
        after = infer(http, cloud, "fmnist-exits", x)
    assert meta["platform"] == "tierlink_early_exit"
    assert before.status == after.status == 200, (before.error, after.error)
    np.testing.assert_array_equal(after.outputs["exit"], before.outputs["exit"])
    np.testing.assert_allclose(after.outputs["logits"], before.outputs["logits"], rtol=1e-6)
