"""``import_model`` (``modelstore/importer.py``) on small real ONNX models made here, one per
output kind: the card it writes (metric, temperature, cascade curve, latency per provider,
the data), the store it installs into, and every refusal -- each an ``ImportRefused``
naming the problem, with nothing half-written in the store."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import byo_support as byo
from tierlink.core.registry import Registry
from tierlink.errors import ImportRefused, TierlinkError
from tierlink.models import kind_registry as registry_mod
from tierlink.models import layout
from tierlink.models.card import ModelCard, card_from_dict
from tierlink.models.data import Labelled, load_data, split
from tierlink.models.evaluate import FINE_THRESHOLDS
from tierlink.models.kind_registry import KindRegistry
from tierlink.models.kinds import Answer, Outputs, role
from tierlink.models.task import TaskSpec, task_from_dict
from tierlink.models.tensors import TensorDecl
from tierlink.modelstore.importer import ImportRequest, import_model
from tierlink.modelstore.store import ModelStore

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class Case:
    """One output kind's model, its data and the flags of a first import."""

    kind: str
    model: Callable[[Path], Path]
    data: Callable[[], tuple[np.ndarray, np.ndarray]]
    outputs: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    fitted: bool = False  # a temperature is fitted
    cascadable: bool = False


CASES = {
    "classification": Case("classification", byo.classifier, byo.classification_data,
                           fitted=True, cascadable=True),
    "classification-probabilities": Case(
        "classification", lambda p: byo.classifier(p, probabilities=True, output="probs"),
        byo.classification_data, options={"probabilities": True}, fitted=True, cascadable=True),
    "multilabel": Case("multilabel", byo.multilabel, byo.multilabel_data, fitted=True,
                       cascadable=True),
    "detection": Case("detection", byo.detector, byo.detection_data,
                      outputs={"boxes": "boxes", "scores": "scores"}, cascadable=True),
    "regression-uncertainty": Case("regression", byo.regression, byo.regression_data,
                                   outputs={"value": "value", "uncertainty": "sd"},
                                   options={"tolerance": 0.3}, cascadable=True),
    # an uncertainty but no tolerance: confident, yet no sample is "right": not cascadable
    "regression-no-tolerance": Case("regression", byo.regression, byo.regression_data,
                                    outputs={"value": "value", "uncertainty": "sd"}),
    "regression": Case("regression", lambda p: byo.regression(p, uncertainty=False),
                       byo.regression_data, options={"tolerance": 0.3}),
    "embedding": Case("embedding", byo.embedder, byo.embedding_data),
}


def request(name: str, onnx: Path, task: str, data: Path, **kw: Any) -> ImportRequest:
    kw.setdefault("tier", "edge")
    return ImportRequest(name=name, model=onnx, task=task, data=data, **kw)


def first_import(store: ModelStore, tmp_path: Path, case: Case, name: str = "m",
                 task: str = "t", **kw: Any) -> ModelCard:
    x, y = case.data()
    onnx = case.model(tmp_path / f"{name}.onnx")
    data = byo.save_npz(tmp_path / f"{name}.npz", x=x, y=y)
    return import_model(request(name, onnx, task, data, kind=case.kind,
                                outputs=MappingProxyType(case.outputs),
                                options=MappingProxyType(case.options), **kw), store)


@pytest.fixture
def classifier(tmp_path: Path) -> tuple[Path, Path]:
    """(onnx, data.npz) of the classifier, right on 75% of 200 samples."""
    x, y = byo.classification_data()
    return byo.classifier(tmp_path / "cls.onnx"), byo.save_npz(tmp_path / "cls.npz", x=x, y=y)


def assert_clean(store: ModelStore, name: str, task: str | None = None) -> None:
    """Nothing half-written: no model directory, no staging or old directories, and (for a
    task no import declared yet) no task file and no data."""
    root = store.root
    assert not (root / name).exists()
    if root.exists():
        assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []
    if task is not None:
        assert store.task(task) is None and not (root / "tasks" / f"{task}.json").exists()
        assert not (root / "data").exists() or not any((root / "data").iterdir())


# -- good imports --------------------------------------------------------------------------

def same(a: float, b: float) -> bool:
    """Equal, or both missing (NaN: a figure the kind cannot give)."""
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("case_id", list(CASES))
def test_a_good_import_writes_a_full_card(model_store, tmp_path, case_id):
    case = CASES[case_id]
    card = first_import(model_store, tmp_path, case)
    kind = registry_mod.kind_of(case.kind)
    assert isinstance(card, ModelCard)
    assert (card.name, card.task, card.kind, card.tier, card.version, card.imported,
            card.format, card.file) == ("m", "t", case.kind, "edge", "1", True, "onnx",
                                        "model.onnx")
    assert card.lineage is None and card.training is None  # not derived, not trained here
    # the metric: the kind's, measured on both parts, neither 0 nor 1 on this data
    assert card.metric == kind.metric
    for score in (card.calib_accuracy, card.test_accuracy):
        assert 0.0 < score < 1.0
    # temperature: fitted where the kind has logits, else 1.0 with no NLL
    cal = card.calibration
    assert cal is not None and cal.temperature == card.temperature
    assert cal.samples == card.data.calib_samples
    if case.fitted:
        assert card.temperature != 1.0 and 0.05 <= card.temperature <= 20.0
        assert cal.nll_after <= cal.nll_before
    else:
        assert card.temperature == 1.0
        assert math.isnan(cal.nll_before) and math.isnan(cal.nll_after)
        written = card.to_dict()["calibration"]  # JSON has no NaN: a missing figure is null
        assert written["nll_before"] is None and written["nll_after"] is None
        # no temperature: the confidence (if any) is the same before and after
        assert same(cal.ece_before, cal.ece_after)
        assert same(cal.test_ece_before, cal.test_ece_after)
    # the cascade curve is there iff the model can be cascaded, and it is not flat
    assert card.cascadable is case.cascadable
    assert bool(card.cascade) is case.cascadable
    if case.cascadable:
        curve = card.cascade
        assert [p.threshold for p in curve] == list(FINE_THRESHOLDS)
        shares = [p.answered_share for p in curve]
        assert shares == sorted(shares, reverse=True) and shares[0] > shares[-1]
        assert len({p.answered_accuracy for p in curve}) > 2
        # a confidence to threshold: its calibration is measured on both parts
        assert not math.isnan(cal.ece_after) and not math.isnan(cal.test_ece_after)
    else:
        assert math.isnan(cal.ece_after) and math.isnan(cal.test_ece_after)
    # latency, per provider
    assert card.provider == CPU and card.latency_by_provider == {CPU: card.latency_ms}
    lat = card.latency_ms
    assert 0 < lat["batch1_p50"] <= lat["batch1_p95"] and lat["batch32_per_sample"] > 0
    # the data it was measured on
    n = len(case.data()[1])
    d = card.data
    assert (d.calib_samples, d.eval_samples, d.seed, d.calib_share) == \
        (n // 2, n - n // 2, 0, 0.5)
    assert d.source == str(tmp_path / "m.npz")
    assert d.sha256 == load_data(tmp_path / "m.npz", [card.inputs[0].name]).sha256
    # the file and the task
    blob = (tmp_path / "m.onnx").read_bytes()
    assert card.sha256 == hashlib.sha256(blob).hexdigest() and card.size_bytes == len(blob)
    assert card.params > 0
    assert card.task_spec == model_store.task("t")
    assert card.task_spec.kind == case.kind and dict(card.task_spec.outputs) == case.outputs
    assert card.labels == card.task_spec.labels
    assert card.inputs == card.task_spec.inputs


def test_an_imported_card_is_written_as_schema_2(model_store, tmp_path):
    card = first_import(model_store, tmp_path, CASES["classification"])
    written = json.loads(model_store.paths("m")[1].read_text())
    assert list(written) == ["schema", "name", "task", "version", "format", "file", "sha256",
                             "size_bytes", "params", "tier", "variant", "entry", "inputs",
                             "outputs", "labels", "kind", "task_spec", "metric",
                             "test_accuracy", "calib_accuracy", "temperature", "calibration",
                             "cascade", "latency_ms", "latency_by_provider", "provider",
                             "precision", "training", "data", "lineage", "multi_exit",
                             "language"]
    assert written["schema"] == 2 and written == card.to_dict()
    assert (written["metric"], written["test_accuracy"], written["calib_accuracy"]) == \
        (card.metric, card.test_accuracy, card.calib_accuracy)
    assert written["kind"] == "classification" and "import_s" not in written
    assert written["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert written["data"] == {"sha256": card.data.sha256, "source": str(tmp_path / "m.npz"),
                               "seed": 0, "calib_share": 0.5, "calib_samples": 100,
                               "eval_samples": 100}
    assert set(written["calibration"]) == {"temperature", "ece_before", "ece_after",
                                           "nll_before", "nll_after", "test_ece_before",
                                           "test_ece_after", "samples"}
    assert card_from_dict(written) == card  # it reads back as the card it was


@pytest.mark.parametrize("case_id", ["classification", "regression-uncertainty", "detection"])
def test_a_good_import_installs_the_model_byte_for_byte(model_store, tmp_path, case_id):
    card = first_import(model_store, tmp_path, CASES[case_id])
    assert model_store.names() == ["m"] and model_store.names("t") == ["m"]
    onnx, card_path = model_store.paths("m")
    assert onnx.read_bytes() == (tmp_path / "m.onnx").read_bytes()
    assert json.loads(card_path.read_text()) == card.to_dict()
    assert model_store.card("m").to_dict() == card.to_dict()
    stored = model_store.load_data(card.data.sha256)
    original = load_data(tmp_path / "m.npz", [card.inputs[0].name])
    np.testing.assert_array_equal(stored.labels, original.labels)
    assert [p.name for p in model_store.root.iterdir() if p.name.startswith(".")] == []


def test_the_metric_is_the_models_own_accuracy_on_the_evaluation_part(model_store, classifier):
    onnx, data = classifier
    card = import_model(request("m", onnx, "t", data, seed=3, calib_share=0.3), model_store)
    x, y = byo.classification_data()
    parts = split(Labelled({"x": x}, y, "sha"), 0.3, seed=3)
    for part, score in ((parts.calib, card.calib_accuracy), (parts.test, card.test_accuracy)):
        right = ((part.inputs["x"] @ byo.W_CLS + byo.B_CLS).argmax(axis=1) == part.labels).mean()
        assert score == pytest.approx(right)
    assert (card.data.calib_samples, card.data.eval_samples) == (60, 140)
    assert (card.data.seed, card.data.calib_share) == (3, 0.3)
    # the store splits the data it keeps as the card was measured
    stored = model_store.splits("m")
    np.testing.assert_array_equal(stored.calib.labels, parts.calib.labels)
    np.testing.assert_array_equal(stored.test.labels, parts.test.labels)
    np.testing.assert_array_equal(stored.test.inputs["x"], parts.test.inputs["x"])


def test_a_probabilities_classifier_gets_the_same_temperature_as_its_logits(model_store,
                                                                            tmp_path):
    logits = first_import(model_store, tmp_path, CASES["classification"], name="a", task="ta")
    probs = first_import(model_store, tmp_path, CASES["classification-probabilities"],
                         name="b", task="tb")
    assert probs.temperature == pytest.approx(logits.temperature, rel=1e-3)
    assert (probs.metric, probs.calib_accuracy, probs.test_accuracy) == \
        (logits.metric, logits.calib_accuracy, logits.test_accuracy)


def test_the_first_import_declares_the_task_and_the_next_model_of_it_imports(
        model_store, tmp_path, classifier):
    onnx, data = classifier
    import_model(request("small", onnx, "spam", data, tier="device", labels=("a", "b", "c"),
                         version="7"), model_store)
    task = model_store.task("spam")
    assert task is not None and task.kind == "classification" and task.labels == ("a", "b", "c")
    assert [i.describe() for i in task.inputs] == ["x FP32[-1, 4]"]
    saved = (model_store.root / "tasks" / "spam.json").read_bytes()
    other = byo.classifier(tmp_path / "other.onnx", output="scores")  # same inputs
    card = import_model(request("large", other, "spam", data, tier="cloud"), model_store)
    assert (card.kind, card.labels, card.tier) == ("classification", ("a", "b", "c"), "cloud")
    assert model_store.names("spam") == ["large", "small"]
    assert model_store.card("small").version == "7"
    assert (model_store.root / "tasks" / "spam.json").read_bytes() == saved  # first one wins


def test_a_reimport_replaces_the_model(model_store, tmp_path, classifier):
    onnx, data = classifier
    import_model(request("m", onnx, "t", data), model_store)
    probs = byo.classifier(tmp_path / "probs.onnx", output="probs", probabilities=True)
    card = import_model(request("m", probs, "t", data, version="2"), model_store)
    assert model_store.card("m") == card and card.version == "2"
    assert model_store.paths("m")[0].read_bytes() == probs.read_bytes()
    assert [p.name for p in model_store.root.iterdir() if p.name.startswith(".")] == []


def test_a_multi_input_model_reads_its_inputs_by_name_from_the_npz(model_store, tmp_path):
    x, y = byo.classification_data()
    onnx = byo.two_input_classifier(tmp_path / "two.onnx")
    data = byo.save_npz(tmp_path / "two.npz", b=x[:, 3:], a=x[:, :3], y=y)
    card = import_model(request("two", onnx, "t", data), model_store)
    assert [i.name for i in card.inputs] == ["a", "b"]
    assert card.test_accuracy == pytest.approx(0.75, abs=0.1)
    stored = model_store.load_data(card.data.sha256)
    assert sorted(stored.inputs) == ["a", "b"]


def test_a_folder_of_npy_with_ids_and_class_names(model_store, tmp_path):
    x, y = byo.classification_data(n=60)
    names = ["cat", "dog", "bird"]
    labels = [names[c] if i % 2 else str(c) for i, c in enumerate(y)]
    folder = byo.npy_folder(tmp_path / "samples", x, labels)
    onnx = byo.classifier(tmp_path / "cls.onnx")
    card = import_model(request("m", onnx, "pets", folder, labels=tuple(names)), model_store)
    assert card.labels == tuple(names) and card.data.source == str(folder)
    assert card.data.calib_samples + card.data.eval_samples == 60
    np.testing.assert_array_equal(model_store.load_data(card.data.sha256).labels, y)
    # the same samples as an .npz are the same data
    npz = byo.save_npz(tmp_path / "same.npz", x=x, y=y)
    assert import_model(request("m2", onnx, "pets", npz), model_store).data.sha256 == \
        card.data.sha256


def test_a_task_declared_by_a_fleet_file_is_used_and_saved(model_store, tmp_path, classifier):
    onnx, data = classifier
    declared = task_from_dict("spam", {"kind": "classification",
                                       "input": {"name": "x", "shape": [-1, 4]},
                                       "outputs": {"scores": "logits"}, "labels": ["a", "b", "c"]})
    card = import_model(request("m", onnx, "spam", data, declared=declared), model_store)
    assert model_store.task("spam") == declared and card.labels == ("a", "b", "c")
    assert card.task_spec == declared


def test_latency_on_each_provider_of_the_list_that_opens(model_store, classifier):
    onnx, data = classifier
    # CUDA is skipped where this onnxruntime has none; CPU runs the model
    card = import_model(request("m", onnx, "t", data,
                                providers=("CUDAExecutionProvider", CPU)), model_store)
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: no fallback to see")
    assert card.provider == CPU and list(card.latency_by_provider) == [CPU]


@pytest.mark.skipif("AzureExecutionProvider" not in ort.get_available_providers(),
                    reason="needs a second execution provider that opens on CPU")
def test_a_second_provider_that_opens_is_timed_too(model_store, classifier):
    onnx, data = classifier
    card = import_model(request("m", onnx, "t", data,
                                providers=("AzureExecutionProvider", CPU)), model_store)
    assert card.provider == "AzureExecutionProvider"
    assert sorted(card.latency_by_provider) == ["AzureExecutionProvider", CPU]
    assert card.latency_ms == card.latency_by_provider["AzureExecutionProvider"]
    assert card.latency_on(CPU) == card.latency_by_provider[CPU]


class Argmax:
    """A user's own kind: the index of the largest score, no confidence."""

    name = "argmax"
    metric = "hits"
    temperature_fit = False
    answers = (("index", "INT64"),)

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        return ("scores",)

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        return None

    def answer(self, raw: Outputs, task: TaskSpec, temperature: float = 1.0) -> Answer:
        return Answer({"index": role(raw, task, "scores").argmax(axis=1)}, None)

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None:
        return answer.outputs["index"] == y

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None:
        return float(self.correct(answer, y, task).mean())


def test_a_users_registered_kind_imports(model_store, classifier, monkeypatch):
    monkeypatch.setattr(registry_mod, "_REGISTRY", KindRegistry((Argmax(),)))
    onnx, data = classifier
    card = import_model(request("m", onnx, "t", data, kind="argmax"), model_store)
    assert card.kind == "argmax" and card.metric == "hits"
    assert card.test_accuracy == pytest.approx(0.75, abs=0.1)
    assert card.cascadable is False and card.temperature == 1.0


def test_progress_is_said(model_store, classifier):
    said: list[str] = []
    onnx, data = classifier
    import_model(request("m", onnx, "t", data), model_store, say=said.append)
    assert said[0].startswith("reading ") and "100 calibration + 100 evaluation" in said[1]
    assert said[-1].startswith("m imported in ") and said[-1].endswith(" s")


# -- bad imports: refused, naming the problem, nothing written -----------------------------

def refused(store: ModelStore, req: ImportRequest, *words: str) -> ImportRefused:
    with pytest.raises(ImportRefused) as err:
        import_model(req, store)
    for word in words:
        assert word in err.value.message, err.value.message
    return err.value


def test_an_onnx_path_that_is_not_a_file(model_store, tmp_path, classifier):
    _, data = classifier
    refused(model_store, request("m", tmp_path / "missing.onnx", "t", data), "missing.onnx")
    refused(model_store, request("m", tmp_path, "t", data), str(tmp_path))  # a folder
    assert_clean(model_store, "m", "t")


def test_random_bytes_are_not_an_onnx_model(model_store, tmp_path, classifier):
    _, data = classifier
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(np.random.default_rng(0).bytes(512))
    err = refused(model_store, request("m", junk, "t", data),
                  "is not an ONNX model ONNX Runtime can load")
    assert "onnx.checker" in err.hint
    assert_clean(model_store, "m", "t")


@pytest.mark.parametrize("other, described", [
    (lambda p: byo.classifier(p, features=5), "x FP32[-1, 5]"),
    (lambda p: byo.classifier(p, dtype=np.float64), "x FP64[-1, 4]"),
    (lambda p: byo.classifier(p, input_name="input"), "input FP32[-1, 4]"),
    (byo.two_input_classifier, "a FP32[-1, 3], b FP32[-1, 1]"),
], ids=["shape", "dtype", "name", "inputs"])
def test_a_second_model_of_another_signature_is_refused(model_store, tmp_path, classifier,
                                                        other, described):
    onnx, data = classifier
    import_model(request("first", onnx, "t", data), model_store)
    saved = (model_store.root / "tasks" / "t.json").read_bytes()
    err = refused(model_store, request("second", other(tmp_path / "other.onnx"), "t", data),
                  f"second takes {described}, but task 't' takes x FP32[-1, 4]",
                  "wrong signature for the task")
    assert "import it under another task" in err.hint
    assert_clean(model_store, "second")
    assert (model_store.root / "tasks" / "t.json").read_bytes() == saved
    assert model_store.names() == ["first"]


def test_labels_of_the_wrong_length(model_store, tmp_path, classifier):
    onnx, _ = classifier
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y[:-3])
    refused(model_store, request("m", onnx, "t", data), "200 samples but there are 197 labels")
    assert_clean(model_store, "m", "t")


def test_empty_data(model_store, tmp_path, classifier):
    onnx, _ = classifier
    data = byo.save_npz(tmp_path / "d.npz", x=np.zeros((0, 4), np.float32),
                        y=np.zeros(0, np.int64))
    refused(model_store, request("m", onnx, "t", data), "holds no samples")
    assert_clean(model_store, "m", "t")


def test_a_single_sample_cannot_be_split(model_store, tmp_path, classifier):
    onnx, _ = classifier
    x, y = byo.classification_data(n=1)
    refused(model_store, request("m", onnx, "t", byo.save_npz(tmp_path / "d.npz", x=x, y=y)),
            "at least 2 are needed")
    assert_clean(model_store, "m", "t")


def rows_of(part: str, n: int = 200, seed: int = 0) -> np.ndarray:
    """The rows of the data that ``split`` puts in ``part``."""
    parts = split(Labelled({"x": np.zeros((n, 1))}, np.arange(n), "sha"), 0.5, seed)
    return getattr(parts, part).labels


def test_labels_out_of_range_for_a_classifier_in_the_calibration_part(model_store, tmp_path,
                                                                      classifier):
    onnx, _ = classifier
    x, y = byo.classification_data()
    y[rows_of("calib")[0]] = 7
    refused(model_store, request("m", onnx, "t", byo.save_npz(tmp_path / "d.npz", x=x, y=y)),
            "labels run 0..7 but the model scores 3 classes")
    assert_clean(model_store, "m", "t")


@pytest.mark.parametrize("bad", [7, -1])
def test_labels_out_of_range_for_a_classifier_in_the_evaluation_part(model_store, tmp_path,
                                                                     classifier, bad):
    onnx, _ = classifier
    x, y = byo.classification_data()
    y[rows_of("test")[0]] = bad
    refused(model_store, request("m", onnx, "t", byo.save_npz(tmp_path / "d.npz", x=x, y=y)),
            "labels run")
    assert_clean(model_store, "m", "t")


def test_class_labels_that_are_not_ids(model_store, tmp_path, classifier):
    onnx, _ = classifier
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y + 0.5)
    refused(model_store, request("m", onnx, "t", data), "label")
    assert_clean(model_store, "m", "t")


def test_multilabel_targets_with_a_label_missing(model_store, tmp_path):
    x, y = byo.multilabel_data()
    onnx = byo.multilabel(tmp_path / "ml.onnx")
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y[:, :2])
    refused(model_store, request("m", onnx, "t", data, kind="multilabel"), "multilabel")
    assert_clean(model_store, "m", "t")


@pytest.mark.parametrize("case_id, targets, words", [
    ("regression", lambda y: np.stack([y, y], axis=1),
     ["do not fit a regression task", "targets must have shape [100, 1], got [100, 2]"]),
    ("detection", lambda y: y[:, :, :4],
     ["do not fit a detection task", "detection labels must be (N=60, G, 5)"]),
])
def test_targets_the_kind_cannot_read(model_store, tmp_path, case_id, targets, words):
    case = CASES[case_id]
    x, y = case.data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=targets(y))
    refused(model_store, request("m", case.model(tmp_path / "m.onnx"), "t", data,
                                 kind=case.kind, outputs=MappingProxyType(case.outputs)), *words)
    assert_clean(model_store, "m", "t")


@pytest.mark.parametrize("x, words", [
    # (the shape named is the calibration part's: 100 of the 200 rows)
    (np.zeros((200, 5), np.float32), ["data for input 'x' has shape [100, 5]",
                                      "the model takes [-1, 4]"]),
    (np.zeros((200, 4, 1), np.float32), ["has shape [100, 4, 1]"]),
    (np.full((200, 4), "a"), ["data for input 'x' is <U1; the model takes FP32"]),
], ids=["size", "rank", "dtype"])
def test_data_of_the_wrong_shape_or_type(model_store, tmp_path, classifier, x, words):
    onnx, _ = classifier
    _, y = byo.classification_data()
    refused(model_store, request("m", onnx, "t", byo.save_npz(tmp_path / "d.npz", x=x, y=y)),
            *words)
    assert_clean(model_store, "m", "t")


@pytest.mark.parametrize("make, kind, role_", [
    (byo.two_outputs_classifier, "classification", "scores"),
    (byo.regression, "regression", "value"),
    (byo.detector, "detection", "boxes"),
])
def test_a_multi_output_model_without_its_roles_declared(model_store, tmp_path, make, kind,
                                                         role_):
    x, y = byo.classification_data()
    if kind == "detection":
        x, y = byo.detection_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    err = refused(model_store, request("m", make(tmp_path / "m.onnx"), "t", data, kind=kind),
                  f"say which one is the '{role_}'")
    assert f"{{{role_}: NAME}}" in err.hint
    assert_clean(model_store, "m", "t")


def test_a_declared_output_the_model_does_not_have(model_store, tmp_path, classifier):
    onnx, data = classifier
    refused(model_store, request("m", onnx, "t", data,
                                 outputs=MappingProxyType({"scores": "probs"})),
            "reads output 'probs' as 'scores'", "['logits']")
    assert_clean(model_store, "m", "t")


def test_an_unknown_kind_is_refused_naming_the_known_ones(model_store, classifier):
    onnx, data = classifier
    with pytest.raises(TierlinkError) as err:
        import_model(request("m", onnx, "t", data, kind="keypoints"), model_store)
    assert "unknown output kind 'keypoints'" in err.value.message
    assert "classification, detection, embedding, multilabel, regression" in err.value.hint
    assert_clean(model_store, "m", "t")


def test_an_unknown_kind_is_an_import_refusal(model_store, classifier):
    onnx, data = classifier
    refused(model_store, request("m", onnx, "t", data, kind="keypoints"),
            "unknown output kind")


def test_a_kind_other_than_the_tasks(model_store, tmp_path, classifier):
    onnx, data = classifier
    import_model(request("first", onnx, "t", data), model_store)
    refused(model_store, request("second", byo.multilabel(tmp_path / "ml.onnx"), "t", data,
                                 kind="multilabel"),
            "task 't' is a classification task; --kind multilabel does not match it")
    assert_clean(model_store, "second")


def test_a_declared_task_that_disagrees_with_the_store(model_store, classifier):
    onnx, data = classifier
    import_model(request("first", onnx, "t", data), model_store)
    declared = task_from_dict("t", {"input": {"name": "x", "shape": [-1, 5]}})
    refused(model_store, request("second", onnx, "t", data, declared=declared),
            "task 't' is declared with inputs x FP32[-1, 5]",
            "the store's models take x FP32[-1, 4]")
    assert_clean(model_store, "second")


@pytest.mark.parametrize("name", ["two words", "a/b", ".hidden", "tasks", "data", ""])
def test_a_bad_model_name(model_store, classifier, name):
    onnx, data = classifier
    err = refused(model_store, request(name, onnx, "t", data), f"model name {name!r} is not usable")
    assert "spam-small" in err.hint
    assert_clean(model_store, "tasks-never", "t")
    assert not model_store.root.exists()


@pytest.mark.parametrize("tier", ["fog", "Edge", ""])
def test_a_tier_not_device_edge_or_cloud(model_store, classifier, tier):
    onnx, data = classifier
    refused(model_store, request("m", onnx, "t", data, tier=tier),
            f"--tier {tier!r}: one of device, edge, cloud")
    assert_clean(model_store, "m", "t")


def test_a_folder_without_labels_csv(model_store, tmp_path, classifier):
    onnx, _ = classifier
    x, y = byo.classification_data(n=10)
    folder = byo.npy_folder(tmp_path / "f", x, y.tolist())
    (folder / "labels.csv").unlink()
    refused(model_store, request("m", onnx, "t", folder), "has no labels.csv")
    assert_clean(model_store, "m", "t")


def test_a_csv_naming_a_missing_file(model_store, tmp_path, classifier):
    onnx, _ = classifier
    x, y = byo.classification_data(n=10)
    folder = byo.npy_folder(tmp_path / "f", x, y.tolist())
    (folder / "s0004.npy").unlink()
    refused(model_store, request("m", onnx, "t", folder), "'s0004.npy' does not exist")
    assert_clean(model_store, "m", "t")


def test_a_failed_reimport_keeps_the_good_version(model_store, tmp_path, classifier):
    onnx, data = classifier
    good = import_model(request("m", onnx, "t", data), model_store)
    blob = model_store.paths("m")[0].read_bytes()
    bad_data = byo.save_npz(tmp_path / "bad.npz", x=np.zeros((200, 5), np.float32),
                            y=byo.classification_data()[1])
    refused(model_store, request("m", onnx, "t", bad_data, version="2"), "has shape")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07garbage")
    refused(model_store, request("m", junk, "t", data, version="2"), "not an ONNX model")
    refused(model_store, request("m", byo.classifier(tmp_path / "c5.onnx", features=5), "t",
                                 data, version="2"), "wrong signature")
    assert model_store.card("m") == good and model_store.paths("m")[0].read_bytes() == blob
    assert model_store.names() == ["m"]
    assert [p.name for p in model_store.root.iterdir() if p.name.startswith(".")] == []


def test_an_install_that_fails_at_the_last_step_declares_no_task(model_store, tmp_path,
                                                                 classifier, monkeypatch):
    onnx, data = classifier

    def disk_full(staging: Path, final: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(layout, "_swap", disk_full)
    with pytest.raises(OSError):
        import_model(request("m", onnx, "t", data), model_store)
    assert_clean(model_store, "m", "t")


def test_a_not_onnx_refusal_does_not_talk_about_the_zoo(model_store, tmp_path, classifier):
    _, data = classifier
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00" * 64)
    err = refused(model_store, request("m", junk, "t", data), "not an ONNX model")
    assert "zoo" not in err.message


def test_a_label_shape_refusal_hints_at_the_data(model_store, tmp_path):
    case = CASES["detection"]
    x, y = case.data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y[:, :, :4])
    err = refused(model_store, request("m", case.model(tmp_path / "m.onnx"), "t", data,
                                       kind=case.kind, outputs=MappingProxyType(case.outputs)),
                  "detection labels must be")
    assert "/v2/models" not in (err.hint or "")


def test_a_python_model_is_imported_without_onnx(model_store, tmp_path):
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    card = import_model(request("py", byo.python_classifier(tmp_path / "src"), "t", data),
                        model_store)
    model_file = model_store.paths("py")[0]
    assert model_file.name == "model.zip" and card.provider == "python"
    assert (card.format, card.file, card.entry) == ("python", "model.zip", "model:Model")
    assert card.latency_ms["batch1_p50"] > 0 and card.params == 0
    assert 0.0 < card.test_accuracy < 1.0 and card.cascadable
    graph = import_model(request("g", byo.classifier(tmp_path / "g.onnx"), "t", data),
                         model_store)
    assert (card.metric, card.calib_accuracy, card.test_accuracy) == \
        (graph.metric, graph.calib_accuracy, graph.test_accuracy)
    assert card.cascade == graph.cascade


def test_a_python_model_of_a_new_task_must_declare_its_inputs(model_store, tmp_path):
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    with pytest.raises(ImportRefused, match="declares no inputs"):
        import_model(request("py", byo.python_classifier(tmp_path / "src",
                                                         declare_inputs=False), "t", data),
                     model_store)
    assert model_store.names() == []
    # once the task is declared (here by an ONNX model of it), the class need not
    import_model(request("g", byo.classifier(tmp_path / "g.onnx"), "t", data), model_store)
    card = import_model(request("py", byo.python_classifier(tmp_path / "src2",
                                                            declare_inputs=False), "t", data),
                        model_store)
    assert card.inputs == (TensorDecl("x", "FP32", (-1, 4)),)


def test_graph_tools_refuse_a_python_model(model_store, tmp_path):
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    import_model(request("py", byo.python_classifier(tmp_path / "src"), "t", data), model_store)
    with pytest.raises(ImportRefused, match="quantize works on ONNX graphs; py is a python"):
        model_store.graph("py", "quantize")


class LinearFile:
    """A user's runtime (format ``linear``): a ``.npz`` of weights ``w`` and bias ``b``,
    logits = x @ w + b. Its signature is read off the file."""

    platform = "numpy"
    provider = "numpy-cpu"

    def __init__(self, spec: Any) -> None:
        from tierlink.models.runtime import ModelInfo

        z = np.load(spec.model_file or spec.directory / spec.read_card().file)
        self.w, self.b = z["w"], z["b"]
        self.info = ModelInfo.of(spec.read_card())
        self.inputs = (TensorDecl("x", "FP32", (-1, self.w.shape[0])),)
        self.outputs = (TensorDecl("logits", "FP32", (-1, self.w.shape[1])),)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if inputs["x"].shape[0] > 1000:
            raise ValueError("too many")
        return {"logits": (inputs["x"] @ self.w + self.b).astype(np.float32)}


@pytest.fixture
def linear_runtime(monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The process's runtime registry with the user's ``linear`` format added by hand."""
    from tierlink.models import runtimes

    registry = Registry(runtimes.ENTRY_POINT_GROUP, "model format")
    registry.register("linear", LinearFile)
    monkeypatch.setattr(runtimes, "_REGISTRY", registry)
    return registry


def test_a_model_of_a_users_runtime_imports_and_serves_through_it(
        model_store, classifier, linear_runtime, tmp_path):
    from tierlink.models import runtimes

    _, data = classifier
    weights = byo.save_npz(tmp_path / "linear.npz", w=byo.W_CLS.astype(np.float32),
                           b=byo.B_CLS.astype(np.float32))
    card = import_model(request("m", weights, "t", data, model_format="linear"), model_store)
    assert (card.format, card.file, card.entry, card.provider) == \
        ("linear", "model.npz", "", "numpy-cpu")
    assert card.test_accuracy == pytest.approx(0.75, abs=0.1) and card.cascadable
    assert [i.name for i in card.inputs] == ["x"] and [o.name for o in card.outputs] == ["logits"]
    model_file, card_file = model_store.paths("m")
    assert hashlib.sha256(model_file.read_bytes()).hexdigest() == card.sha256
    served = runtimes.load(runtimes.LoadSpec(card_file))
    x = byo.features(3, 0)
    assert np.allclose(served.infer({"x": x})["logits"], x @ byo.W_CLS + byo.B_CLS, atol=1e-5)


def test_a_format_no_runtime_serves_is_refused_naming_the_installed_ones(
        model_store, classifier, linear_runtime):
    onnx, data = classifier
    with pytest.raises(ImportRefused, match=r"'tflite'.*one of linear") as info:
        import_model(request("m", onnx, "t", data, model_format="tflite"), model_store)
    assert "tierlink.runtimes" in info.value.hint
    with pytest.raises(ImportRefused, match="'llm'"):
        import_model(request("m", onnx, "t", data, model_format="llm"), model_store)
    with pytest.raises(ImportRefused, match="'gguf'"):  # llama.cpp's: named in the fleet file
        import_model(request("m", onnx, "t", data, model_format="gguf"), model_store)
    assert_clean(model_store, "m", "t")


def test_a_runtime_that_cannot_load_the_file_is_refused_naming_it(
        model_store, classifier, linear_runtime, tmp_path):
    _, data = classifier
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz")
    with pytest.raises(ImportRefused, match=r"'linear' runtime cannot load .*bad\.npz"):
        import_model(request("m", bad, "t", data, model_format="linear"), model_store)
    with pytest.raises(ImportRefused, match="from one file"):
        import_model(request("m", tmp_path, "t", data, model_format="linear"), model_store)
    assert_clean(model_store, "m", "t")


class ScaledArgmax(Argmax):
    """A user's kind that fits a temperature on a likelihood of its own."""

    name = "scaled"
    temperature_fit = True

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        return role(raw, task, "scores").astype(np.float64)

    def nll(self, logits: np.ndarray, y: np.ndarray, task: TaskSpec,
            temperature: float) -> float:
        z = logits / temperature
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(len(y)), y].mean())


def test_a_users_kind_fits_its_temperature_on_its_own_likelihood(
        model_store, classifier, monkeypatch):
    monkeypatch.setattr(registry_mod, "_REGISTRY", KindRegistry((ScaledArgmax(),)))
    onnx, data = classifier
    card = import_model(request("m", onnx, "t", data, kind="scaled"), model_store)
    assert card.temperature != 1.0
    assert card.calibration.nll_after < card.calibration.nll_before
