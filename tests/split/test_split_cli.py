"""``tierlink split list|codecs`` on the test-profile zoo (fast, real Fashion-MNIST images)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tierlink.cli.split import app
from tierlink.demo.fleets import fleet_path
from tierlink.zoo import ensure_zoo

EXAMPLE_FLEET = fleet_path()
MODEL = "fmnist-small"
CUT = "/12/MaxPool_output_0"


def test_list_json_by_zoo_name_and_path():
    result = CliRunner().invoke(app, ["list", MODEL, "--profile", "test", "--json"])
    assert result.exit_code == 0, result.output
    cuts = json.loads(result.stdout)
    assert cuts[0]["tensor"] == "input"
    assert {"tensor": CUT, "shape": [-1, 64, 3, 3], "bytes_per_sample": 2304}.items() <= \
        next(c for c in cuts if c["tensor"] == CUT).items()
    path = ensure_zoo(profile="test", progress=False).path(MODEL)
    table = CliRunner().invoke(app, ["list", str(path)])
    assert table.exit_code == 0 and "MaxPool" in table.stdout


def test_codecs_json_reports_each_codec_at_the_cut():
    result = CliRunner().invoke(app, [
        "codecs", MODEL, "--profile", "test", "--samples", "60", "--cut", CUT,
        "--codec", "fp32", "--codec", "int8+zstd", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["samples"] == 60 and [c["tensor"] for c in doc["cuts"]] == [CUT]
    fp32, int8 = doc["rows"]
    assert (fp32["codec"], fp32["ratio"], fp32["delta_pt"], fp32["agreement"]) == \
        ("fp32", 1.0, 0.0, 1.0)
    assert int8["codec"] == "int8+zstd" and int8["ratio"] > 3
    assert int8["encode_us"] > 0 and int8["decode_us"] > 0


def test_bad_model_cut_and_codec_exit_2():
    runner = CliRunner()
    assert runner.invoke(app, ["list", "resnet"]).exit_code == 2
    assert runner.invoke(app, ["list", "missing.onnx"]).exit_code == 2
    bad_cut = runner.invoke(app, ["codecs", MODEL, "--profile", "test", "--cut", "nope"])
    assert bad_cut.exit_code == 2 and "nope" in bad_cut.output
    bad_codec = runner.invoke(app, ["codecs", MODEL, "--profile", "test", "--codec", "lz4"])
    assert bad_codec.exit_code == 2 and "lz4" in bad_codec.output


def test_codecs_write_their_measured_loss_into_the_fleet_file(tmp_path):
    from tierlink.fleet.config import load_fleet

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(EXAMPLE_FLEET.read_text())
    result = CliRunner().invoke(app, [
        "codecs", MODEL, "--profile", "test", "--samples", "60", "--cut", CUT,
        "--codec", "fp32", "--codec", "int8", "--codec", "topk:0.1", "--json",
        "--write", str(fleet)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    int8 = next(r for r in doc["rows"] if r["codec"] == "int8")
    assert doc["losses"] == {"int8": round(100 * (1 - int8["agreement"]), 3)}  # priced only
    assert doc["written"] == str(fleet)
    assert dict(load_fleet(fleet).routing.split_codec_loss) == doc["losses"]
    assert "measured on fmnist-small" in fleet.read_text()


def test_codec_losses_take_each_codec_s_worst_cut():
    from tierlink.cli.split import codec_losses

    rows = [{"codec": "int8", "agreement": 0.999, "delta_pt": 0.0},
            {"codec": "int8", "agreement": 0.99, "delta_pt": -0.4},
            {"codec": "fp16", "agreement": 1.0, "delta_pt": -0.2},
            {"codec": "fp32", "agreement": 1.0, "delta_pt": 0.0},
            {"codec": "thr:0.5", "agreement": 0.5, "delta_pt": -30.0}]
    assert codec_losses(rows) == {"int8": 1.0, "fp16": 0.2}
