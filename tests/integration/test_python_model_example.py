"""The Python-model example, end to end as its how-to page tells it
(docs/how-to/python-model.md): a family trained with scikit-learn outside tierlink
(examples/python_model/train.py), imported with the CLI as Python models (no ONNX anywhere),
its cascade tuned with the CLI, served by a real fleet from the example's fleet file, and
called through ``tierlink.Client``: the device's linear model answers what it is sure of,
the cloud's perceptron the rest, and the answers are as good as the cloud's alone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tierlink
from tierlink.fleet.launcher import RunningFleet

from .integration_support import running_fleet

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python_model"


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, check=False, env=dict(os.environ, COLUMNS="200"))
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def digits_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    root = tmp_path_factory.mktemp("digits")
    saved = os.environ.get("TIERLINK_HOME")
    os.environ["TIERLINK_HOME"] = str(root / "home")  # the CLI and the nodes inherit it
    try:
        run(str(EXAMPLE / "train.py"), "--out", str(root))
        fleet_file = root / "fleet.yaml"
        fleet_file.write_text((EXAMPLE / "fleet.yaml").read_text())
        for name, tier in (("digits-linear", "device"), ("digits-mlp", "cloud")):
            run("-m", "tierlink.cli.main", "model", "import", name, str(root / name),
                "--task", "digits", "--tier", tier, "--data", str(root / "heldout.npz"),
                "--fleet", str(fleet_file))
        run("-m", "tierlink.cli.main", "cascade", "tune", str(fleet_file), "--task", "digits",
            "--accuracy-drop", "1.5", "--confidence", "0.9")
        from tierlink.cli.models import fleet_models

        models = fleet_models("test", ("digits-linear", "digits-mlp"), progress=False)
        with running_fleet(fleet_file.read_text(), root / "run", models) as fleet:
            yield fleet
    finally:
        if saved is None:
            os.environ.pop("TIERLINK_HOME", None)
        else:
            os.environ["TIERLINK_HOME"] = saved


def test_the_digits_family_is_served_across_tiers_without_onnx(
        digits_fleet: RunningFleet, tmp_path_factory: pytest.TempPathFactory) -> None:
    held = np.load(next(tmp_path_factory.getbasetemp().glob("digits*")) / "heldout.npz")
    x, y = held["pixels"][:120], held["y"][:120]
    with tierlink.Client(digits_fleet.node_urls["dev-1"]) as node:
        answers = [node.infer("digits", {"pixels": x[i:i + 1]}, deadline_ms=3000,
                              privacy="any") for i in range(len(y))]
        meta = {m.name: m for m in node.models()}
    labels = np.array([int(a["label"][0]) for a in answers])
    served = [a.served_by for a in answers]
    assert float((labels == y).mean()) >= 0.95
    assert served.count("dev-1") >= 40 and served.count("cloud-1") >= 5, served
    assert "digits-linear" in meta
