"""``tierlink model import`` and ``tierlink model imported`` through the real CLI app
(typer's CliRunner), into a model store under ``TIERLINK_HOME`` in ``tmp_path``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnxruntime as ort
import pytest
from typer.testing import CliRunner

import byo_support as byo
from tierlink.cli.main import app

runner = CliRunner()
CPU = "CPUExecutionProvider"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    x, y = byo.classification_data()
    xr, yr = byo.regression_data()
    return {"cls": byo.classifier(tmp_path / "cls.onnx"),
            "cls_data": byo.save_npz(tmp_path / "cls.npz", x=x, y=y),
            "reg": byo.regression(tmp_path / "reg.onnx"),
            "reg_data": byo.save_npz(tmp_path / "reg.npz", x=xr, y=yr)}


def model_import(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(app, ["model", "import", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def test_import_prints_the_card_as_json_and_installs_it(model_store, files):
    code, out, _ = model_import("spam-small", files["cls"], "--task", "spam", "--tier", "device",
                                "--data", files["cls_data"], "--labels", "ham, spam, eggs",
                                "--seed", "2", "--calib-share", "0.25", "--version", "3",
                                "--json")
    assert code == 0
    card = json.loads(out)
    assert (card["name"], card["task"], card["kind"], card["tier"], card["version"]) == \
        ("spam-small", "spam", "classification", "device", "3")
    assert card["labels"] == ["ham", "spam", "eggs"]
    assert (card["data"]["seed"], card["data"]["calib_samples"]) == (2, 50)
    # the card as it is written (schema 2), nothing published
    assert card["schema"] == 2 and "published" not in card and "import_s" not in card
    assert card["metric"] == "accuracy" and 0.0 < card["test_accuracy"] < 1.0
    assert model_store.card("spam-small").to_dict() == card
    assert json.loads(model_store.paths("spam-small")[1].read_text()) == card
    assert model_store.paths("spam-small")[0].read_bytes() == files["cls"].read_bytes()


def test_import_of_a_regression_with_roles_options_and_providers(model_store, files):
    code, out, _ = model_import("price-1", files["reg"], "--task", "price", "--tier", "edge",
                                "--data", files["reg_data"], "--kind", "regression",
                                "--output", "value=value", "--output", "uncertainty = sd",
                                "--option", "tolerance=0.3", "--option", "note=free text",
                                "--providers", "cuda,cpu", "--json")
    assert code == 0
    card = json.loads(out)
    assert card["task_spec"]["outputs"] == {"value": "value", "uncertainty": "sd"}
    assert card["task_spec"]["options"] == {"tolerance": 0.3, "note": "free text"}
    assert card["kind"] == "regression" and card["metric"] == "r2"
    assert card["cascade"] and model_store.card("price-1").cascadable  # a curve: cascadable
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert card["provider"] == CPU and list(card["latency_by_provider"]) == [CPU]


def test_option_values_are_typed(model_store, files):
    code, out, _ = model_import("m", files["cls"], "--task", "t", "--tier", "edge", "--data",
                                files["cls_data"], "--option", "probabilities=false",
                                "--option", "threshold=5e-1", "--option", "top=2", "--json")
    assert code == 0
    assert json.loads(out)["task_spec"]["options"] == {"probabilities": False, "threshold": 0.5,
                                                       "top": 2}


def test_import_without_json_says_what_it_measured(model_store, files):
    code, out, err = model_import("m", files["cls"], "--task", "t", "--tier", "cloud",
                                  "--data", files["cls_data"])
    assert code == 0 and out == ""
    text = " ".join(err.split())  # rich wraps long lines
    assert "imported m (t, classification, cloud): accuracy 0.7" in text
    assert "on 100 evaluation samples" in text and "cascadable" in text
    assert f"on {CPU}" in text
    # the time it took is a line of its own, not the end of the card's
    assert re.search(r"\bm imported in \d+\.\d s\b", text), text
    assert text.endswith(", cascadable"), text


def test_a_task_declared_in_a_fleet_file(model_store, files, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("""
tasks:
  spam:
    kind: classification
    input: {name: x, datatype: FP32, shape: [-1, 4]}
    outputs: {scores: logits}
    labels: [ham, spam, eggs]
nodes:
  - {id: dev-1, tier: device, models: [spam-small]}
links: []
""")
    code, out, _ = model_import("spam-small", files["cls"], "--task", "spam", "--tier",
                                "device", "--data", files["cls_data"], "--fleet", fleet, "--json")
    assert code == 0 and json.loads(out)["labels"] == ["ham", "spam", "eggs"]
    code, _, err = model_import("x", files["cls"], "--task", "other", "--tier", "device",
                                "--data", files["cls_data"], "--fleet", fleet)
    assert code == 2 and "declares no task 'other' under tasks:" in err


@pytest.mark.parametrize("extra, words", [
    (["--tier", "fog"], ["error: --tier 'fog': one of device, edge, cloud"]),
    (["--tier", "edge", "--output", "scores"], ["--output 'scores': expected KEY=VALUE"]),
    (["--tier", "edge", "--option", "=1"], ["--option '=1': expected KEY=VALUE"]),
    (["--tier", "edge", "--providers", ""], ["--providers must be a list"]),
    (["--tier", "edge", "--kind", "keypoints"], ["unknown output kind 'keypoints'",
                                                    "hint: choose one of classification"]),
])
def test_refusals_exit_2_with_the_problem_and_a_hint(model_store, files, extra, words):
    code, out, err = model_import("m", files["cls"], "--task", "t", "--data", files["cls_data"],
                                  *extra)
    assert code == 2 and out == ""
    text = " ".join(err.split())
    for word in words:
        assert word in text
    assert not model_store.has("m") and model_store.task("t") is None


def test_an_onnx_file_that_is_not_a_model(model_store, files, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00" * 64)
    code, _, err = model_import("m", junk, "--task", "t", "--tier", "edge", "--data",
                                files["cls_data"])
    assert code == 2 and "is not an ONNX model" in " ".join(err.split())
    assert "onnx.checker" in " ".join(err.split())
    assert model_store.names() == []


def test_a_model_of_another_signature(model_store, files, tmp_path):
    assert model_import("a", files["cls"], "--task", "t", "--tier", "edge", "--data",
                        files["cls_data"])[0] == 0
    code, _, err = model_import("b", byo.classifier(tmp_path / "c5.onnx", features=5), "--task",
                                "t", "--tier", "edge", "--data", files["cls_data"])
    assert code == 2 and "wrong signature for the task" in " ".join(err.split())
    assert model_store.names() == ["a"]


def test_imported_lists_the_store(model_store, files):
    for name, task in (("a", "t1"), ("b", "t2")):
        assert model_import(name, files["cls"], "--task", task, "--tier", "edge", "--data",
                            files["cls_data"])[0] == 0
    result = runner.invoke(app, ["model", "imported", "--json"])
    assert result.exit_code == 0
    listed = json.loads(result.stdout)
    assert [c["name"] for c in listed] == ["a", "b"]
    assert listed == [model_store.card(n).to_dict() for n in ("a", "b")]
    assert {c["schema"] for c in listed} == {2}
    result = runner.invoke(app, ["model", "imported", "--json", "--task", "t2"])
    assert [c["name"] for c in json.loads(result.stdout)] == ["b"]
    result = runner.invoke(app, ["model", "imported"], env={"COLUMNS": "200"})  # no wrapping
    assert result.exit_code == 0
    assert f"model store {model_store.root}" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("│ ")]
    cells = [[c.strip() for c in row.split("│")[1:-1]] for row in rows]
    assert [c[:5] for c in cells] == [["a", "1", "t1", "classification", "edge"],
                                      ["b", "1", "t2", "classification", "edge"]]
    assert "accuracy 0.7" in rows[0] and CPU in rows[0]


def test_imported_on_an_empty_store(model_store):
    result = runner.invoke(app, ["model", "imported", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout) == []


def test_zoo_calibration_lists_an_imported_task(model_store, files):
    code, _, _ = model_import("toy-cls", files["cls"], "--task", "toy", "--tier", "edge",
                              "--data", files["cls_data"])
    assert code == 0
    result = runner.invoke(app, ["zoo", "calibration", "--task", "toy", "--json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    row = rows["toy-cls"]
    assert row["temperature"] != 1.0 and 0.0 <= row["ece_after"] <= 1.0
    assert {"test_ece_before", "test_ece_after", "nll_before", "nll_after"} <= set(row)
    missing = runner.invoke(app, ["zoo", "calibration", "--task", "nothing-here"])
    assert missing.exit_code == 2 and "no zoo task" in missing.stderr


def test_the_catalog_lists_every_source_in_order(model_store, tmp_path):
    """``tierlink model catalog --json``: the store (what a user imported) first, then the
    zoo (what it builds on first use), then the signed repository (what was installed from
    it: nothing yet)."""
    import json

    from typer.testing import CliRunner

    import byo_support as byo
    from tierlink.cli.main import app

    x, y = byo.classification_data()
    result = CliRunner().invoke(app, ["model", "import", "toy", str(byo.classifier(
        tmp_path / "toy.onnx")), "--task", "toy", "--tier", "edge", "--data",
        str(byo.save_npz(tmp_path / "toy.npz", x=x, y=y))])
    assert result.exit_code == 0, result.output
    listed = CliRunner().invoke(app, ["model", "catalog", "--json"])
    assert listed.exit_code == 0, listed.output
    catalog = json.loads(listed.stdout)
    assert list(catalog) == ["store", "zoo", "repo"] and catalog["store"] == ["toy"]
    assert catalog["repo"] == []
    assert "fmnist-small" in catalog["zoo"] and "fmnist-exits" in catalog["zoo"]
