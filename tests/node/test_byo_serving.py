"""Imported models of every output kind served by a real node (``NodeService`` in its OIP
app, in-process): the node loads them from the model store as ``tierlink node`` does
(``load_runtimes``), and a request for the *task* answers with the kind's tensors and its
confidence -- not class probabilities."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import byo_support as byo
from tierlink.core.types import Tier
from tierlink.errors import RuntimeFailure
from tierlink.models.kinds import sigmoid
from tierlink.models.runtime import FakeModel, ModelInfo, read_answer
from tierlink.models.task import TaskSpec
from tierlink.models.tensors import TensorDecl
from tierlink.modelstore.importer import ImportRequest, import_model
from tierlink.modelstore.store import ModelStore
from tierlink.node.app import create_app
from tierlink.node.main import load_runtimes
from tierlink.node.service import NodeService
from tierlink.node.spec import ModelSource, NodeSpec
from tierlink.transport import oip

LOCAL = {"tierlink.privacy": "local", "tierlink.deadline_ms": 2000}

# model -> (task, kind, onnx builder, data maker, roles, options)
MODELS: dict[str, tuple[Any, ...]] = {
    "price-sd": ("price", "regression", byo.regression, byo.regression_data,
                 {"value": "value", "uncertainty": "sd"}, {"tolerance": 0.3}),
    "price-plain": ("cost", "regression", lambda p: byo.regression(p, uncertainty=False),
                    byo.regression_data, {}, {}),
    "tags": ("tagging", "multilabel", byo.multilabel, byo.multilabel_data, {}, {}),
    "boxes": ("finding", "detection", byo.detector, byo.detection_data,
              {"boxes": "boxes", "scores": "scores"}, {}),
    "vectors": ("similar", "embedding", byo.embedder, byo.embedding_data, {}, {}),
    # a user's Python model (no ONNX): the classifier as numpy, loaded by its runtime
    "py-toy": ("toy", "classification", lambda p: byo.python_classifier(p.with_suffix("")),
               byo.classification_data, {}, {}),
}


def import_all(store: ModelStore, tmp_path: Path) -> None:
    for name, (task, kind, build, data, roles, options) in MODELS.items():
        x, y = data()
        import_model(ImportRequest(name, build(tmp_path / f"{name}.onnx"), task, "device",
                                   byo.save_npz(tmp_path / f"{name}.npz", x=x, y=y), kind=kind,
                                   outputs=MappingProxyType(roles),
                                   options=MappingProxyType(options)), store)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelStore]:
    """Every model of MODELS imported once for the module, under a TIERLINK_HOME of its own."""
    home = tmp_path_factory.mktemp("byo-serving")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIERLINK_HOME", str(home / "home"))
        store = ModelStore.default()
        import_all(store, home)
        yield store


@pytest.fixture
def node(store: ModelStore) -> Iterator[TestClient]:
    spec = NodeSpec("dev-1", Tier.DEVICE, tuple(
        ModelSource(name, *map(str, store.paths(name))) for name in MODELS))
    with TestClient(create_app(NodeService(spec, load_runtimes(spec)), ready=True)) as client:
        yield client


def infer(client: TestClient, name: str, x: np.ndarray, binary: bool = True
          ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    body, headers = oip.encode_infer_request({"x": x}, LOCAL, None, binary_inputs=binary,
                                             binary_outputs=binary)
    resp = client.post(f"/v2/models/{name}/infer", content=body, headers=headers)
    assert resp.status_code == 200, resp.text
    out = oip.decode_infer_response(resp.content, oip.parse_header_length(
        resp.headers.get("inference-header-content-length")))
    return out.outputs, out.parameters


X = byo.features(3, seed=11)  # three inputs of every model but the detector


@pytest.mark.parametrize("binary", [True, False])
def test_a_regression_task_answers_value_uncertainty_and_its_confidence(node, binary):
    outputs, params = infer(node, "price", X, binary)
    assert sorted(outputs) == ["uncertainty", "value"]
    np.testing.assert_allclose(outputs["value"], X @ byo.W_REG + byo.B_REG, rtol=1e-5)
    sd = 0.5 * np.abs(X[:, 0]) + 0.1
    np.testing.assert_allclose(outputs["uncertainty"], sd, rtol=1e-5)
    # the batch's confidence: its least sure answer
    assert params["tierlink.confidence"] == pytest.approx(float((1 / (1 + sd)).min()), abs=1e-5)
    assert (params["tierlink.model"], params["tierlink.served_by"]) == ("price-sd", "dev-1")
    assert params["tierlink.escalations"] == 0


def test_a_python_model_answers_its_task_through_the_node(node, store):
    outputs, params = infer(node, "toy", X)
    temperature = store.card("py-toy").temperature
    z = (X @ byo.W_CLS + byo.B_CLS) / temperature
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(outputs["probabilities"], p, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(outputs["label"], p.argmax(axis=1))
    assert (params["tierlink.model"], params["tierlink.served_by"]) == ("py-toy", "dev-1")
    raw, _ = infer(node, "py-toy", X)  # the model itself: its raw outputs
    np.testing.assert_allclose(raw["logits"], X @ byo.W_CLS + byo.B_CLS, rtol=1e-5)


def test_a_regression_without_uncertainty_answers_its_value_with_full_confidence(node):
    outputs, params = infer(node, "cost", X)
    assert list(outputs) == ["value"]
    np.testing.assert_allclose(outputs["value"], X @ byo.W_REG + byo.B_REG, rtol=1e-5)
    assert params["tierlink.confidence"] == 1.0  # none to threshold on: never escalated for it


def test_a_multilabel_task_answers_calibrated_probabilities_and_labels(node, store):
    outputs, params = infer(node, "tagging", X)
    assert sorted(outputs) == ["labels", "probabilities"]
    temperature = store.card("tags").temperature
    assert temperature != 1.0  # fitted at import: the node applies it
    p = sigmoid(X @ byo.W_ML + byo.B_ML, temperature)
    np.testing.assert_allclose(outputs["probabilities"], p, rtol=1e-5)
    assert outputs["labels"].dtype == np.int8
    np.testing.assert_array_equal(outputs["labels"], (p >= 0.5).astype(np.int8))
    assert params["tierlink.confidence"] == pytest.approx(float(np.maximum(p, 1 - p).min()),
                                                          abs=1e-5)


def test_a_detection_task_answers_boxes_scores_and_classes(node):
    x, _ = byo.detection_data(n=4, seed=3)
    outputs, params = infer(node, "finding", x)
    assert sorted(outputs) == ["boxes", "classes", "scores"]
    np.testing.assert_allclose(outputs["boxes"], x[:, :8].reshape(4, 2, 4), rtol=1e-6)
    scores = 1 / (1 + np.exp(-x[:, 8:]))
    np.testing.assert_allclose(outputs["scores"], scores, rtol=1e-5)
    assert outputs["classes"].tolist() == [[0, 0]] * 4
    certainty = np.where(scores >= 0.1, np.maximum(scores, 1 - scores), 1.0)
    assert params["tierlink.confidence"] == pytest.approx(float(certainty.min()), abs=1e-5)


def test_an_embedding_task_answers_unit_vectors(node):
    outputs, params = infer(node, "similar", X)
    assert list(outputs) == ["embedding"]
    v = X @ byo.W_EMB
    np.testing.assert_allclose(outputs["embedding"], v / np.linalg.norm(v, axis=1, keepdims=True),
                               rtol=1e-5)
    assert params["tierlink.confidence"] == 1.0


def test_the_model_endpoint_still_answers_raw_outputs(node):
    outputs, _ = infer(node, "price-sd", X)
    assert sorted(outputs) == ["sd", "value"]


def test_metadata_names_each_models_kind_and_provider(node):
    meta = node.get("/v2/models/price-sd").json()
    assert meta["parameters"] == {"task": "price", "tier": "device", "kind": "regression",
                                  "provider": "CPUExecutionProvider"}
    routed = node.get("/v2/models/tagging").json()
    assert routed["platform"] == "tierlink_router"
    assert routed["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert [(o["name"], o["datatype"]) for o in routed["outputs"]] == \
        [("probabilities", "FP32"), ("labels", "INT8")]
    status = node.get("/tierlink/v1/status").json()
    assert status["tasks"] == sorted(m[0] for m in MODELS.values())
    assert status["providers"].pop("py-toy") == "python"  # a Python model runs itself
    assert set(status["providers"].values()) == {"CPUExecutionProvider"}
    info = [line for line in node.get("/metrics").text.splitlines()
            if line.startswith("tierlink_model_info{")]
    assert len(info) == len(MODELS)
    assert any('kind="detection"' in line and 'model="boxes"' in line for line in info)


def test_routed_metadata_lists_the_answers_of_a_regression_with_uncertainty(node):
    routed = node.get("/v2/models/price").json()
    assert [(o["name"], o["datatype"]) for o in routed["outputs"]] == \
        [("value", "FP32"), ("uncertainty", "FP32")]


def test_routed_metadata_lists_only_what_the_answer_carries(node):
    outputs, _ = infer(node, "cost", X)
    routed = node.get("/v2/models/cost").json()
    assert [o["name"] for o in routed["outputs"]] == list(outputs)


def test_routed_metadata_shapes_have_the_answers_rank(node):
    outputs, _ = infer(node, "price", X)
    routed = {o["name"]: o["shape"] for o in node.get("/v2/models/price").json()["outputs"]}
    assert {n: len(s) for n, s in routed.items()} == {n: a.ndim for n, a in outputs.items()}


def test_a_query_for_one_answer_tensor(node):
    body, headers = oip.encode_infer_request({"x": X}, LOCAL, ["uncertainty"])
    resp = node.post("/v2/models/price/infer", content=body, headers=headers)
    assert resp.status_code == 200
    out = oip.decode_infer_response(resp.content, oip.parse_header_length(
        resp.headers.get("inference-header-content-length")))
    assert list(out.outputs) == ["uncertainty"]


def test_a_wrong_input_is_a_clear_400(node):
    body, headers = oip.encode_infer_request({"x": np.zeros((1, 5), np.float32)}, LOCAL, None)
    resp = node.post("/v2/models/price/infer", content=body, headers=headers)
    assert resp.status_code == 400 and "shape" in resp.json()["error"]


# -- read_answer ---------------------------------------------------------------------------

def test_a_zoo_model_without_a_task_spec_is_read_as_a_classifier():
    info = ModelInfo("fmnist-small", "fmnist", "1", temperature=2.0)
    rt = FakeModel(info, classes=3)
    logits = np.array([[np.log(9.0) * 2, 0.0, 0.0]], np.float32)  # T = 2: 9 : 1 : 1
    answer = read_answer(rt, {"logits": logits})
    assert info.spec_for(rt.outputs).output("scores") == "logits"
    np.testing.assert_allclose(answer.outputs["probabilities"], [[0.9 / 1.1 * 1.0, 1 / 11,
                                                                  1 / 11]], rtol=1e-5)
    assert answer.outputs["label"].tolist() == [0]


def test_outputs_that_do_not_fit_the_declared_task_are_a_runtime_failure():
    spec = TaskSpec("price", "regression", (TensorDecl("input", "FP32", (-1, 1, 28, 28)),),
                    MappingProxyType({"value": "predicted"}))
    rt = FakeModel(ModelInfo("m", "price", "1", task_spec=spec))
    with pytest.raises(RuntimeFailure, match=r"m: task 'price' reads output 'predicted'"):
        read_answer(rt, {"logits": np.zeros((1, 10), np.float32)})


def test_an_imported_card_gives_its_task_spec(store):
    info = ModelInfo.from_card(store.paths("price-sd")[1])
    assert info.task_spec is not None and info.task_spec.kind == "regression"
    assert dict(info.task_spec.outputs) == {"value": "value", "uncertainty": "sd"}
    assert info.accuracy == json.loads(store.paths("price-sd")[1].read_text())["test_accuracy"]
