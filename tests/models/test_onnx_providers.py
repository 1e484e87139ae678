"""Execution providers (``providers.py``): an ordered list with fallback to CPU, each
provider passed over recorded with why; short names; a node's ``OnnxModel`` reports the
provider that runs it and takes the card's latency measured on that provider."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnxruntime as ort
import pytest

import byo_support as byo
from tierlink.errors import ConfigError, ModelError
from tierlink.models.onnx import (
    CPU,
    DEFAULT_PROVIDERS,
    OnnxModel,
    open_session,
    parse_providers,
    session_options,
)
from tierlink.models.runtime import ModelInfo
from tierlink.modelstore.importer import ImportRequest, import_model

CUDA = "CUDAExecutionProvider"
no_cuda = pytest.mark.skipif(CUDA in ort.get_available_providers(),
                             reason="this onnxruntime has CUDA: nothing to fall back from")


@pytest.fixture
def onnx_path(tmp_path):
    return byo.classifier(tmp_path / "cls.onnx")


@no_cuda
def test_cuda_then_cpu_falls_back_to_cpu_on_this_build(onnx_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tierlink.models.onnx"):
        opened = open_session(onnx_path, (CUDA, CPU))
    assert opened.provider == CPU and opened.session.get_providers() == [CPU]
    assert opened.skipped == (f"{CUDA}: not in this onnxruntime build",)
    assert f"cls.onnx: skipped {CUDA}: not in this onnxruntime build" in caplog.text


def test_an_unknown_provider_is_skipped_and_cpu_is_the_last_resort(onnx_path):
    opened = open_session(onnx_path, ("NoSuchExecutionProvider",))
    assert opened.provider == CPU
    assert opened.skipped == ("NoSuchExecutionProvider: not in this onnxruntime build",)


def test_the_default_is_cpu_with_nothing_skipped(onnx_path):
    opened = open_session(onnx_path)
    assert DEFAULT_PROVIDERS == (CPU,) and opened.provider == CPU and opened.skipped == ()
    out = opened.session.run(None, {"x": np.ones((1, 4), np.float32)})[0]
    np.testing.assert_allclose(out, np.ones((1, 4)) @ byo.W_CLS + byo.B_CLS, rtol=1e-5)


def test_a_provider_whose_session_fails_to_open_is_skipped_with_the_reason(onnx_path,
                                                                           monkeypatch):
    """A CUDA build on a machine without a GPU: listed, but opening a session fails."""
    real = ort.InferenceSession

    def session(path, options, providers):
        if providers == [CUDA]:
            raise RuntimeError("CUDA failure 100: no CUDA-capable device is detected\nmore")
        return real(path, options, providers=providers)

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", session)
    opened = open_session(onnx_path, (CUDA, CPU))
    assert opened.provider == CPU
    assert opened.skipped == (f"{CUDA}: CUDA failure 100: no CUDA-capable device is detected",)


def test_nothing_opens_a_file_that_is_not_onnx(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01 not a model")
    with pytest.raises(ModelError, match="cannot load ONNX model"):
        open_session(junk, (CUDA, CPU))


def test_cpu_is_tried_once_even_when_listed_twice(onnx_path, monkeypatch):
    tried: list[list[str]] = []
    real = ort.InferenceSession

    def session(path, options, providers):
        tried.append(providers)
        return real(path, options, providers=providers)

    monkeypatch.setattr(ort, "InferenceSession", session)
    open_session(onnx_path, (CPU, "cpu-again", CPU))
    assert tried == [[CPU]]


def test_session_options_keep_to_one_thread_without_spinning():
    opts = session_options()
    assert opts.intra_op_num_threads == 1 and opts.inter_op_num_threads == 1
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert session_options(3).intra_op_num_threads == 3


@pytest.mark.parametrize("raw, expected", [
    (None, (CPU,)),
    ("cuda,cpu", (CUDA, CPU)),
    (" cuda , cpu ,", (CUDA, CPU)),
    (["tensorrt", "CUDA", "cpu"], ("TensorrtExecutionProvider", CUDA, CPU)),
    (["openvino", "dml", "coreml", "rocm", "migraphx"],
     ("OpenVINOExecutionProvider", "DmlExecutionProvider", "CoreMLExecutionProvider",
      "ROCMExecutionProvider", "MIGraphXExecutionProvider")),
    ([CUDA, "AzureExecutionProvider"], (CUDA, "AzureExecutionProvider")),  # full names kept
])
def test_parse_providers_short_and_full_names(raw, expected):
    assert parse_providers(raw, "nodes[0].providers") == expected


@pytest.mark.parametrize("raw", [[], "", ",", 3, {"cuda": 1}])
def test_parse_providers_refuses_what_is_not_a_list_naming_the_field(raw):
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.providers must be a list"):
        parse_providers(raw, "nodes[0].providers")


# -- a node's model on a provider ----------------------------------------------------------

@pytest.fixture
def imported_card(model_store, tmp_path):
    """The classifier imported (on CPU), its card rewritten as if it had been imported on a
    machine with a GPU too: 0.2 ms on CUDA, 3.5 ms on CPU."""
    x, y = byo.classification_data()
    import_model(ImportRequest("m", byo.classifier(tmp_path / "m.onnx"), "t", "edge",
                               byo.save_npz(tmp_path / "m.npz", x=x, y=y)), model_store)
    onnx, card_path = model_store.paths("m")
    card = json.loads(card_path.read_text())
    figures = {"batch1_p50": 0.2, "batch1_p95": 0.3, "batch32_per_sample": 0.01}
    card["latency_ms"] = figures
    card["latency_by_provider"] = {CUDA: figures, CPU: {**figures, "batch1_p50": 3.5}}
    card["provider"] = CUDA
    card_path.write_text(json.dumps(card))
    return onnx, card_path


@no_cuda
def test_an_onnx_model_reports_its_provider_and_takes_that_providers_latency(imported_card):
    onnx, card_path = imported_card
    info = ModelInfo.from_card(card_path)
    assert info.latency_ms == 0.2  # the card's headline figure: CUDA's
    model = OnnxModel(onnx, info, providers=(CUDA, CPU))
    assert model.provider == CPU
    assert model.skipped_providers == (f"{CUDA}: not in this onnxruntime build",)
    assert model.info.latency_ms == 3.5  # what the node will really see
    assert model.info.task_spec is not None and model.info.task_spec.kind == "classification"
    out = model.infer({"x": np.ones((2, 4), np.float32)})
    assert out["logits"].shape == (2, 3)


def test_on_provider_keeps_the_latency_where_the_card_has_no_figure(imported_card):
    _, card_path = imported_card
    info = ModelInfo.from_card(card_path)
    assert info.on_provider("NoSuchExecutionProvider") is info
    assert info.on_provider(CPU).latency_ms == 3.5 and info.on_provider(CUDA).latency_ms == 0.2
    zoo = ModelInfo("fmnist-small", "fmnist", "1", latency_ms=1.5)  # a card without figures
    assert zoo.on_provider(CPU).latency_ms == 1.5
