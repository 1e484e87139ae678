"""``tierlink split list|codecs`` on the test-profile zoo (fast, real Fashion-MNIST images)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tierlink.cli.split import app
from tierlink.zoo import ensure_zoo

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
