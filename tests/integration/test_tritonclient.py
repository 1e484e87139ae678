"""The stock ``tritonclient.http`` client against a real edge node: health, metadata, and
inference whose outputs equal ONNX Runtime's on the same file, binary and JSON."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import Models

pytestmark = pytest.mark.integration
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException

MODEL = "fmnist-medium"  # served by the edges of the shared fleet
NODE = "edge-1"


@pytest.fixture(scope="module")
def triton(shared_fleet: RunningFleet) -> Iterator[Any]:
    url = shared_fleet.node_urls[NODE].removeprefix("http://")
    client = httpclient.InferenceServerClient(url=url, connection_timeout=10.0,
                                              network_timeout=10.0)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def batch(fmnist_test: Labelled) -> np.ndarray:
    return np.ascontiguousarray(fmnist_test.input[:4])  # (4, 1, 28, 28) float32


def onnxruntime_logits(models: Models, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(models[MODEL][0]), opts,
                                   providers=["CPUExecutionProvider"])
    return session.run(["logits"], {session.get_inputs()[0].name: x})[0]  # (N, 10)


def triton_infer(client: Any, model: str, x: np.ndarray, binary: bool, output: str,
                 parameters: dict[str, Any] | None = None) -> Any:
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput(output, binary_data=binary)
    return client.infer(model, [inp], outputs=[out], parameters=parameters)


def test_health_and_metadata(triton: Any) -> None:
    assert triton.is_server_live()
    assert triton.is_server_ready()
    assert triton.is_model_ready(MODEL)
    assert not triton.is_model_ready("no-such-model")
    meta = triton.get_model_metadata(MODEL)
    assert meta["name"] == MODEL
    assert [i["name"] for i in meta["inputs"]] == ["input"]
    assert meta["inputs"][0]["datatype"] == "FP32"
    assert [o["name"] for o in meta["outputs"]] == ["logits"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_matches_onnxruntime(triton: Any, zoo_models: Models, batch: np.ndarray,
                                   binary: bool) -> None:
    result = triton_infer(triton, MODEL, batch, binary, "logits")
    got = result.as_numpy("logits")
    assert got.shape == (len(batch), 10)
    np.testing.assert_allclose(got, onnxruntime_logits(zoo_models, batch), rtol=1e-5,
                               atol=1e-6)


def test_unknown_model_raises(triton: Any, batch: np.ndarray) -> None:
    with pytest.raises(InferenceServerException) as info:
        triton_infer(triton, "no-such-model", batch, True, "logits")
    assert "no-such-model" in str(info.value)


def test_routed_task_through_tritonclient(triton: Any, batch: np.ndarray) -> None:
    result = triton_infer(triton, "fmnist", batch[:1], True, "probabilities",
                          parameters={"tierlink.privacy": "site"})
    probs = result.as_numpy("probabilities")  # (1, 10)
    assert probs.shape == (1, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    params = result.get_response().get("parameters", {})
    assert params.get("tierlink.tier") == "edge", params  # `site` never goes to the cloud
