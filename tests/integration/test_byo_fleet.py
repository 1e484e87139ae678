"""Users' own models on a real fleet: models none of the zoo built, imported with the CLI
into a model store of the test's own, served by real node processes and called through
``tierlink.Client``. The classifier task has a Python model on the device (no ONNX: a numpy
class with load/predict) and an ONNX graph in the cloud; it is routed and answered with
calibrated probabilities;
a regression task without an uncertainty output is answered with its values and never
escalated; a malformed input is refused at the device and never reaches the cloud."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

import tierlink
from tierlink.errors import PrivacyViolation, TensorError
from tierlink.fleet.launcher import RunningFleet

from .integration_support import running_fleet

pytestmark = pytest.mark.integration

FLEET = """
name: itest-byo
seed: 5
control: {ttl_s: 3}
routing: {policy: tierlink, allow_policy_override: true}
nodes:
  - {id: cloud-1, tier: cloud, models: [toy-cloud, gauge-cloud]}
  - {id: dev-1, tier: device, models: [toy-device, gauge-device]}
links:
  - {from: dev-1, to: cloud-1, delay_ms: 2}
"""


def tierlink_cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tierlink.cli.main", *args],
                          capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, COLUMNS="200"))
    assert done.returncode == 0, f"tierlink {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def byo_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    import byo_support as byo

    root = tmp_path_factory.mktemp("byo")
    saved = os.environ.get("TIERLINK_HOME")
    os.environ["TIERLINK_HOME"] = str(root / "home")  # the nodes inherit it
    try:
        x, y = byo.classification_data(300)
        xr, yr = byo.regression_data(300)
        toy, gauge = byo.save_npz(root / "toy.npz", x=x, y=y), byo.save_npz(
            root / "gauge.npz", x=xr, y=yr)
        tierlink_cli("model", "import", "toy-cloud", str(byo.classifier(root / "toy.onnx")),
                     "--task", "toy", "--tier", "cloud", "--data", str(toy), "--labels",
                     "a,b,c")
        tierlink_cli("model", "import", "toy-device",  # a Python model: the same classifier
                     str(byo.python_classifier(root / "toy-py", scale=0.3)), "--entry",
                     "model:Model", "--task", "toy", "--tier", "device", "--data", str(toy))
        for tier in ("device", "cloud"):
            tierlink_cli("model", "import", f"gauge-{tier}",
                         str(byo.regression(root / f"gauge-{tier}.onnx", uncertainty=False)),
                         "--task", "gauge", "--tier", tier, "--kind", "regression",
                         "--data", str(gauge))
        from tierlink.cli.models import fleet_models

        models = fleet_models("test", ("toy-device", "toy-cloud", "gauge-device",
                                       "gauge-cloud"), progress=False)
        with running_fleet(FLEET, root / "fleet", models) as fleet:
            yield fleet
    finally:
        if saved is None:
            os.environ.pop("TIERLINK_HOME", None)
        else:
            os.environ["TIERLINK_HOME"] = saved


def received(fleet: RunningFleet, node: str) -> float:
    """Inputs the node has received (its ``tierlink_inputs_received_total``)."""
    text = httpx.get(f"{fleet.node_urls[node]}/metrics", timeout=5, trust_env=False).text
    return sum(float(v) for v in re.findall(r"^tierlink_inputs_received_total\{.*\} (\S+)$",
                                            text, re.MULTILINE))


def test_an_imported_classifier_task_is_routed_and_answered(byo_fleet: RunningFleet) -> None:
    import byo_support as byo

    x = byo.features(8, seed=11)
    with tierlink.Client(byo_fleet.node_urls["dev-1"]) as node:
        answer = node.infer("toy", x, deadline_ms=2000, privacy="any")
        direct = node.infer("toy-device", {"x": x})
        listed = {m.name for m in node.models()}
    expected = (x @ byo.W_CLS + byo.B_CLS).argmax(axis=1)
    assert answer["label"].tolist() == expected.tolist()
    np.testing.assert_allclose(answer["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
    assert answer.served_by in ("dev-1", "cloud-1") and 0.0 < answer.confidence <= 1.0
    assert direct["logits"].argmax(axis=1).tolist() == expected.tolist() and not direct.routed
    assert {"toy-device", "gauge-device"} <= listed
    meta = httpx.get(f"{byo_fleet.node_urls['dev-1']}/v2/models/toy-device", timeout=5,
                     trust_env=False).json()
    assert meta["platform"] == "python"  # served without ONNX


def test_a_task_without_confidence_is_answered_and_never_escalated(
        byo_fleet: RunningFleet) -> None:
    import byo_support as byo

    x = byo.features(4, seed=12)
    with tierlink.Client(byo_fleet.node_urls["dev-1"]) as node:
        answers = [node.infer("gauge", x[i:i + 1], deadline_ms=2000, privacy="any")
                   for i in range(4)]
    np.testing.assert_allclose([float(a["value"][0]) for a in answers],
                               x @ byo.W_REG + byo.B_REG, rtol=1e-5)
    assert all(a.escalations == 0 and "uncertainty" not in a.outputs for a in answers)


@pytest.mark.parametrize("bad", [np.zeros((1, 5), np.float32), np.zeros((1, 4), np.float64)],
                         ids=["wrong-shape", "wrong-dtype"])
def test_a_malformed_input_is_refused_at_the_device_and_never_travels(
        byo_fleet: RunningFleet, bad: np.ndarray) -> None:
    before = received(byo_fleet, "cloud-1")
    with tierlink.Client(byo_fleet.node_urls["dev-1"]) as node, \
            pytest.raises(TensorError) as refused:
        node.infer("toy", {"x": bad}, deadline_ms=2000, privacy="any",
                   parameters={"tierlink.policy": "cloud_only"})
    assert refused.value.details.get("status") == 400
    assert "toy" in refused.value.message
    assert received(byo_fleet, "cloud-1") == before


def test_a_policy_that_ignores_privacy_has_its_plans_refused_by_the_router(
        byo_fleet: RunningFleet) -> None:
    """``cloud_only`` plans a ``local`` input to the cloud: the device's router refuses the
    plan (403), counts it under the policy's name, and the input never travels."""
    import byo_support as byo

    before = received(byo_fleet, "cloud-1")
    with tierlink.Client(byo_fleet.node_urls["dev-1"]) as node, \
            pytest.raises(PrivacyViolation) as refused:
        node.infer("toy", {"x": byo.features(1, seed=3)}, deadline_ms=2000, privacy="local",
                   parameters={"tierlink.policy": "cloud_only"})
    assert "policy 'cloud_only' planned to send a 'local'" in refused.value.message
    assert received(byo_fleet, "cloud-1") == before
    text = httpx.get(f"{byo_fleet.node_urls['dev-1']}/metrics", timeout=5,
                     trust_env=False).text
    assert re.search(r'^tierlink_privacy_refusals_total\{policy="cloud_only",privacy="local",'
                     r'tier="device"\} [1-9]', text, re.MULTILINE), text
