"""The split tools on a user's imported model: cut points, codecs measured on the model's
own evaluation data, a per-machine profile saved beside its card — and a clear refusal for a
model whose answers are not top-1 classes."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import byo_support as byo
from tierlink.cli.main import app
from tierlink.models.split_profile import profile_path
from tierlink.modelstore.importer import ImportRequest, import_model

runner = CliRunner()


def imported(store, tmp_path: Path, kind: str = "classification") -> str:
    if kind == "classification":
        x, y = byo.classification_data(120)
        onnx = byo.classifier(tmp_path / "cls.onnx")
    else:
        x, y = byo.regression_data(120)
        onnx = byo.regression(tmp_path / "reg.onnx", uncertainty=False)
    name = f"toy-{kind[:3]}"
    import_model(ImportRequest(name, onnx, f"toy{kind[:3]}", "edge",
                               byo.save_npz(tmp_path / f"{kind}.npz", x=x, y=y),
                               kind=kind), store)
    return name


def test_split_list_and_codecs_measure_an_imported_classifier(model_store, tmp_path):
    name = imported(model_store, tmp_path)
    cuts = json.loads(runner.invoke(app, ["split", "list", name, "--json"]).stdout)
    assert [c["tensor"] for c in cuts][:2] == ["x", "z"]
    result = runner.invoke(app, ["split", "codecs", name, "--cut", "z", "--codec", "fp32",
                                 "--codec", "int8", "--samples", "40", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["samples"] == 40 and 0.5 < doc["accuracy"] < 1.0  # the model is 75% right
    fp32 = next(r for r in doc["rows"] if r["codec"] == "fp32")
    assert fp32["agreement"] == 1.0 and fp32["delta_pt"] == 0.0


def test_split_profile_is_saved_beside_the_imported_card(model_store, tmp_path):
    name = imported(model_store, tmp_path)
    result = runner.invoke(app, ["split", "profile", name, "--rounds", "2", "--json"])
    assert result.exit_code == 0, result.stderr
    saved = profile_path(model_store.paths(name)[1])
    assert saved.is_file() and json.loads(saved.read_text())["model"] == name


def test_split_codecs_refuses_a_model_without_top1_answers(model_store, tmp_path):
    name = imported(model_store, tmp_path, "regression")
    result = runner.invoke(app, ["split", "codecs", name, "--samples", "10"])
    assert result.exit_code == 2
    assert "measures top-1 answers" in result.stderr and "regression" in result.stderr
