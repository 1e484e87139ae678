"""The Python-model example, end to end as its how-to page tells it
(docs/how-to/python-model.md): a family trained with scikit-learn outside tierlink
(examples/python_model/train.py), imported with the CLI as Python models (no ONNX anywhere),
its cascade tuned with the CLI, served by a real fleet from the example's fleet file, and
called through ``tierlink.Client``: the device's linear model answers what it is sure of,
the cloud's perceptron the rest, and the answers are as good as the cloud's alone. And the
same cascade with the cloud's perceptron as an ONNX graph: a Python model and an ONNX model
in one cascade, on one fleet. And a multi-exit model imported from its ONNX segments, in one
cascade with the ONNX graph."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tierlink

from .integration_support import running_fleet
from .integration_support import tierlink as tierlink_cli

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python_model"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The example trained and both models imported, under a TIERLINK_HOME of its own."""
    root = tmp_path_factory.mktemp("digits")
    saved = os.environ.get("TIERLINK_HOME")
    os.environ["TIERLINK_HOME"] = str(root / "home")  # the CLI and the nodes inherit it
    try:
        subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--out", str(root)],
                       check=True, capture_output=True, timeout=300)
        (root / "fleet.yaml").write_text((EXAMPLE / "fleet.yaml").read_text())
        for name, tier in (("digits-linear", "device"), ("digits-mlp", "cloud")):
            tierlink_cli("model", "import", name, str(root / name), "--task", "digits",
                         "--tier", tier, "--data", str(root / "heldout.npz"), "--fleet",
                         str(root / "fleet.yaml"))
        yield root
    finally:
        if saved is None:
            os.environ.pop("TIERLINK_HOME", None)
        else:
            os.environ["TIERLINK_HOME"] = saved


def served_digits(root: Path, fleet_file: Path, models: tuple[str, ...]) -> list[Any]:
    """Tune the fleet file's cascade, run the fleet, ask dev-1 for 120 held-out digits."""
    from tierlink.cli.models import fleet_models

    tierlink_cli("cascade", "tune", str(fleet_file), "--task", "digits", "--accuracy-drop",
                 "1.5", "--confidence", "0.9")
    paths = fleet_models("test", models, progress=False)
    held = np.load(root / "heldout.npz")
    with running_fleet(fleet_file.read_text(), root / f"run-{fleet_file.stem}", paths) as fleet, \
            tierlink.Client(fleet.node_urls["dev-1"]) as node:
        answers = [node.infer("digits", {"pixels": held["pixels"][i:i + 1]}, deadline_ms=3000,
                              privacy="any") for i in range(120)]
    labels = np.array([int(a["label"][0]) for a in answers])
    assert float((labels == held["y"][:120]).mean()) >= 0.95
    return answers


def test_the_digits_family_is_served_across_tiers_without_onnx(trained: Path) -> None:
    answers = served_digits(trained, trained / "fleet.yaml", ("digits-linear", "digits-mlp"))
    served = [a.served_by for a in answers]
    assert served.count("dev-1") >= 40 and served.count("cloud-1") >= 5, served


def test_a_python_model_and_an_onnx_model_in_one_cascade(trained: Path) -> None:
    """The cloud's perceptron exported to ONNX (a MatMul/Add/Relu graph of its weights, as
    skl2onnx would write it) and imported beside the Python device model."""
    graph = mlp_onnx(trained / "digits-mlp" / "weights.npz", trained / "digits-mlp.onnx")
    tierlink_cli("model", "import", "digits-mlp-onnx", str(graph), "--task", "digits",
                 "--tier", "cloud", "--data", str(trained / "heldout.npz"))
    fleet_file = trained / "mixed.yaml"
    fleet_file.write_text((trained / "fleet.yaml").read_text().replace(
        "models: [digits-mlp]", "models: [digits-mlp-onnx]"))
    answers = served_digits(trained, fleet_file, ("digits-linear", "digits-mlp-onnx"))
    served = [a.served_by for a in answers]
    assert served.count("dev-1") >= 40 and served.count("cloud-1") >= 5, served
    models = {a.model for a in answers}
    assert models == {"digits-linear", "digits-mlp-onnx"}


def test_an_imported_multi_exit_model_in_one_cascade_with_an_onnx_model(trained: Path) -> None:
    """The device model a multi-exit net of the two (its first exit the linear model, its
    last the perceptron), imported from its ONNX segments; the cloud's perceptron as an
    ONNX graph."""
    segments = exits_onnx(trained / "digits-linear" / "weights.npz",
                          trained / "digits-mlp" / "weights.npz", trained / "digits-exits")
    for name, model, tier, extra in (
            ("digits-exits", segments, "device", ("--format", "multi-exit")),
            ("digits-mlp-onnx", mlp_onnx(trained / "digits-mlp" / "weights.npz",
                                         trained / "digits-mlp.onnx"), "cloud", ())):
        tierlink_cli("model", "import", name, str(model), "--task", "digits", "--tier", tier,
                     "--data", str(trained / "heldout.npz"), *extra)
    fleet_file = trained / "exits.yaml"
    fleet_file.write_text((trained / "fleet.yaml").read_text().replace(
        "models: [digits-mlp]", "models: [digits-mlp-onnx]").replace(
        "models: [digits-linear]", "models: [digits-exits]"))
    answers = served_digits(trained, fleet_file, ("digits-exits", "digits-mlp-onnx"))
    served = [a.served_by for a in answers]
    assert served.count("dev-1") >= 40 and served.count("cloud-1") >= 1, served
    assert {a.model for a in answers} == {"digits-exits", "digits-mlp-onnx"}


def exits_onnx(linear: Path, mlp: Path, directory: Path) -> Path:
    """Two segments: ``pixels`` -> the perceptron's hidden layer and, as exit 1, the linear
    model's logits; the hidden layer -> the perceptron's logits."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    lin, per = np.load(linear), np.load(mlp)
    hidden = per["w0"].shape[1]
    directory.mkdir(parents=True, exist_ok=True)
    first = [helper.make_node("Div", ["pixels", "scale"], ["x"]),
             helper.make_node("MatMul", ["x", "mw0"], ["h0"]),
             helper.make_node("Add", ["h0", "mb0"], ["a0"]),
             helper.make_node("Relu", ["a0"], ["hidden"]),
             helper.make_node("MatMul", ["x", "lw0"], ["l0"]),
             helper.make_node("Add", ["l0", "lb0"], ["exit1"])]
    second = [helper.make_node("MatMul", ["hidden", "mw1"], ["h1"]),
              helper.make_node("Add", ["h1", "mb1"], ["logits"])]
    parts = (
        ("s1", first, [("pixels", 64)], [("hidden", hidden), ("exit1", 10)],
         {"scale": np.array(16.0, np.float32), "mw0": per["w0"], "mb0": per["b0"],
          "lw0": lin["w0"], "lb0": lin["b0"]}),
        ("s2", second, [("hidden", hidden)], [("logits", 10)],
         {"mw1": per["w1"], "mb1": per["b1"]}))
    for name, nodes, ins, outs, weights in parts:
        graph = helper.make_graph(
            nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", d]) for n, d in ins],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", d]) for n, d in outs],
            [numpy_helper.from_array(v, k) for k, v in weights.items()])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                    ir_version=8), str(directory / f"{name}.onnx"))
    return directory


def mlp_onnx(weights: Path, path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.load(weights)
    inits = [numpy_helper.from_array(w[k], k) for k in ("w0", "b0", "w1", "b1")]
    inits.append(numpy_helper.from_array(np.array(16.0, np.float32), "scale"))
    nodes = [helper.make_node("Div", ["pixels", "scale"], ["x"]),
             helper.make_node("MatMul", ["x", "w0"], ["h0"]),
             helper.make_node("Add", ["h0", "b0"], ["a0"]),
             helper.make_node("Relu", ["a0"], ["r0"]),
             helper.make_node("MatMul", ["r0", "w1"], ["h1"]),
             helper.make_node("Add", ["h1", "b1"], ["logits"])]
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), str(path))
    return path
