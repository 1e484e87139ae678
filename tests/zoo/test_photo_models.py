"""The photo task's models: MobileNetV2's split profile is made once, beside its card, and
remade when the model was rebuilt or the profile lacks codec measurements."""

from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from tierlink.core.types import CodecPoint, SplitPoint
from tierlink.zoo import photo_models as demo

MODEL = "imagenet-mobilenetv2"


def test_a_fleet_without_the_photo_model_needs_nothing_made():
    assert demo.photo_models(("fmnist-small", "fmnist-large")) == {}


def write_model(root: Path, content: bytes = b"onnx bytes") -> Path:
    from tierlink.models.card import ModelCard, TrainingInfo, file_sha256, save_card
    from tierlink.models.tensors import TensorDecl
    from tierlink.zoo.mobilenet import card_path

    path = root / MODEL / "1" / "model.onnx"  # the framework's layout
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    card = ModelCard(
        task="imagenet", name=MODEL, variant="mobilenetv2", version="1", tier="device",
        params=1, size_bytes=len(content), sha256=file_sha256(path),
        inputs=(TensorDecl("input", "FP32", (-1, 3, 224, 224)),),
        outputs=(TensorDecl("logits", "FP32", (-1, 1000)),), labels=("a",), test_accuracy=0.7,
        calib_accuracy=0.0, latency_ms=MappingProxyType(dict.fromkeys(
            ("batch1_p50", "batch1_p95", "batch32_per_sample"), 1.0)),
        cascade=(), temperature=1.0, training=TrainingInfo(0, 0, 1.0, "pretrained", "x"))
    save_card(card, card_path(path))
    return path


@pytest.fixture
def profiler(monkeypatch):
    """Fake profiling: records each call and returns a one-cut profile of the file asked."""
    from tierlink.split import profile as split_profile
    from tierlink.zoo import photos

    calls: list[dict] = []

    def fake(name, model_path, sample, sha256, *, rounds, only, **_):
        calls.append({"rounds": rounds, "keeps_blocks": only("features.4"),
                      "keeps_inner": only("/features/features.4/conv/conv.0/Relu")})
        point = SplitPoint("features.4", 5.0, 9.0, 100352,
                           (CodecPoint("fp16", 50331, 0.3, 0.1),))
        return split_profile.SplitProfile(name, sha256, "here", 14.0, 602112, (point,))

    monkeypatch.setattr(split_profile, "profile_model", fake)
    monkeypatch.setattr(photos, "imagenet_photos",
                        lambda views=True: (np.zeros((1, 3, 224, 224), np.float32), ["x"]))
    return calls


def test_the_split_profile_is_made_once_beside_the_card(tmp_path, profiler):
    from tierlink.models.split_profile import load_profile

    onnx_path = write_model(tmp_path)
    said: list[str] = []
    path = demo.ensure_split_profile(MODEL, onnx_path, said.append)
    assert path == onnx_path.parent / "card.splits.json"  # beside its card
    assert profiler == [{"rounds": demo.PROFILE_ROUNDS, "keeps_blocks": True,
                         "keeps_inner": False}]
    assert load_profile(path).points[0].cut == "features.4"
    assert any("split profile" in m for m in said)
    assert demo.ensure_split_profile(MODEL, onnx_path) == path and len(profiler) == 1


def test_a_profile_of_another_build_is_remade(tmp_path, profiler):
    onnx_path = write_model(tmp_path)
    demo.ensure_split_profile(MODEL, onnx_path)
    write_model(tmp_path, b"a rebuilt model")  # new sha256 in the card
    demo.ensure_split_profile(MODEL, onnx_path)
    assert len(profiler) == 2


def test_a_profile_without_codec_measurements_is_remade(tmp_path, profiler):
    from tierlink.models.card import load_card
    from tierlink.models.split_profile import SplitProfile, profile_path, save_profile
    from tierlink.zoo.mobilenet import card_path

    onnx_path = write_model(tmp_path)
    sha = load_card(card_path(onnx_path)).sha256
    old = SplitProfile(MODEL, sha, "here", 14.0, 602112,
                       (SplitPoint("features.4", 5.0, 9.0, 100352),))
    save_profile(old, profile_path(card_path(onnx_path)))
    demo.ensure_split_profile(MODEL, onnx_path)
    assert len(profiler) == 1
