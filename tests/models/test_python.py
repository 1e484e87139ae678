"""A user's Python model as a runtime: packed into one file, unpacked and loaded through
the runtime registry like an ONNX model, answering what the equivalent graph answers,
refusing bad input, mapping its own failures at the boundary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import byo_support as byo
from tierlink.errors import ModelError, RuntimeFailure, TensorError
from tierlink.models import runtimes
from tierlink.models.onnx import OnnxModel
from tierlink.models.package import unpack
from tierlink.models.python import PythonModel, pack
from tierlink.models.runtime import ModelInfo
from tierlink.models.runtimes import LoadSpec
from tierlink.models.tensors import TensorDecl

INFO = ModelInfo("py-cls", "toy", "1")
LOGITS = (TensorDecl("logits", "FP32", (-1, 3)),)


def card(directory: Path, **extra: object) -> Path:
    path = directory / "card.json"
    path.write_text(json.dumps({
        "name": "py-cls", "task": "toy", "version": "1", "format": "python",
        "file": "model.zip", "entry": "model:Model", "test_accuracy": 0.7,
        "latency_ms": {"batch1_p50": 0.05, "batch1_p95": 0.06, "batch32_per_sample": 0.01},
        "input": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "output": [{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}], **extra}))
    return path


def test_packing_is_reproducible_and_leaves_out_caches(tmp_path: Path) -> None:
    source = byo.python_classifier(tmp_path / "src")
    (source / "__pycache__").mkdir()
    (source / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"junk")
    pack(source, tmp_path / "a.zip")
    pack(source, tmp_path / "b.zip")
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    unpacked = unpack(tmp_path / "a.zip")
    assert sorted(p.name for p in unpacked.iterdir()) == ["model.py", "weights.npz"]
    assert unpack(tmp_path / "a.zip") == unpacked  # once


def test_the_registry_loads_it_by_its_cards_format_and_it_answers_as_the_graph(
        tmp_path: Path) -> None:
    pack(byo.python_classifier(tmp_path / "src"), tmp_path / "model.zip")
    rt = runtimes.load(LoadSpec(card=card(tmp_path)))
    assert isinstance(rt, PythonModel) and rt.platform == "python"
    assert rt.inputs == (TensorDecl("x", "FP32", (-1, 4)),) and rt.outputs == LOGITS
    graph = OnnxModel(byo.classifier(tmp_path / "cls.onnx"), INFO)
    x = byo.features(16, seed=1)
    np.testing.assert_allclose(rt.infer({"x": x})["logits"],
                               graph.infer({"x": x})["logits"], rtol=1e-5, atol=1e-6)


def test_bad_input_is_refused_before_the_users_code_runs(tmp_path: Path) -> None:
    pack(byo.python_classifier(tmp_path / "src"), tmp_path / "model.zip")
    rt = runtimes.load(LoadSpec(card=card(tmp_path)))
    with pytest.raises(TensorError, match="shape"):
        rt.infer({"x": np.zeros((2, 5), np.float32)})
    with pytest.raises(TensorError, match="FP32"):
        rt.infer({"x": np.zeros((2, 4), np.float64)})


def test_the_users_failures_are_runtime_failures(tmp_path: Path) -> None:
    source = byo.python_classifier(tmp_path / "src")
    (source / "model.py").write_text((source / "model.py").read_text().replace(
        'return {"logits"', 'raise ValueError("boom")\n        return {"logits"'))
    model = PythonModel(source, "model:Model", INFO, outputs=LOGITS)
    with pytest.raises(RuntimeFailure, match="ValueError: boom"):
        model.infer({"x": np.zeros((1, 4), np.float32)})


@pytest.mark.parametrize(("entry", "message"), [
    ("model", "not 'module:Class'"), ("nothere:Model", "no module 'nothere'"),
    ("model:Nope", "no class 'Nope'")])
def test_a_wrong_entry_is_a_model_error_naming_it(tmp_path: Path, entry: str,
                                                  message: str) -> None:
    with pytest.raises(ModelError, match=message):
        PythonModel(byo.python_classifier(tmp_path / "src"), entry, INFO)


def test_two_versions_of_one_module_live_side_by_side(tmp_path: Path) -> None:
    one = PythonModel(byo.python_classifier(tmp_path / "v1"), "model:Model", INFO, outputs=LOGITS)
    two = PythonModel(byo.python_classifier(tmp_path / "v2", scale=3.0), "model:Model", INFO,
                      outputs=LOGITS)
    x = byo.features(4, seed=2)
    np.testing.assert_allclose(two.infer({"x": x})["logits"], 3 * one.infer({"x": x})["logits"],
                               rtol=1e-5, atol=1e-5)


def test_a_package_with_relative_imports_loads(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "spam").mkdir(parents=True)
    (source / "spam" / "__init__.py").write_text("from .core import Model\n")
    (source / "spam" / "core.py").write_text(byo.PYTHON_MODEL)
    np.savez(source / "weights.npz", w=byo.W_CLS, b=byo.B_CLS)
    model = PythonModel(source, "spam:Model", INFO, outputs=LOGITS)
    assert model.infer({"x": np.zeros((1, 4), np.float32)})["logits"].shape == (1, 3)


def test_a_format_without_a_runtime_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="format 'tensorflow', which no runtime serves"):
        runtimes.load(LoadSpec(card=card(tmp_path, format="tensorflow")))
