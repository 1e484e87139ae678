"""Real, tiny model versions for the model-manager tests, and a fake repository.

A version of model ``m`` (task ``t``) is a ~32 KB ONNX graph taking the zoo's input
(``input``: FP32 ``[N, 1, 28, 28]``) whose logits are constant: class ``int(version) % 10``
wins, so an answer tells which version gave it. :func:`publish` writes a version, signed, into
a directory laid out as the fake repository reads it (``<repo>/<version>/model.onnx``,
``card.json``, ``signed.json``); :class:`FakeSource` serves it as the control plane would.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from onnx import TensorProto, helper, numpy_helper

from tierlink.errors import ControlPlaneError, RepositoryError
from tierlink.models.onnx import OnnxModel
from tierlink.models.runtime import ModelInfo
from tierlink.repo.manifest import SignedManifest, Validation, VersionManifest
from tierlink.repo.signing import public_key_string, sign_manifest
from tierlink.repo.verify import hash_file

NAME = "m"
TASK = "t"
CLASSES = 10


def winner(version: str) -> int:
    """The class a version's answers pick."""
    return int(version) % CLASSES


def write_model(directory: Path, version: str, *, name: str = NAME,
                task: str = TASK) -> tuple[Path, Path]:
    """``model.onnx`` + ``card.json`` of ``version`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    bias = np.zeros(CLASSES, dtype=np.float32)
    bias[winner(version)] = 5.0
    weights = np.zeros((28 * 28, CLASSES), dtype=np.float32)  # (784, C)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"], axis=1),  # (N, 784)
         helper.make_node("Gemm", ["flat", "w", "b"], ["logits"])],  # (N, C)
        "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx_path, card_path = directory / "model.onnx", directory / "card.json"
    onnx.save(model, str(onnx_path))
    card_path.write_text(json.dumps({"name": name, "task": task, "version": version,
                                     "test_accuracy": 0.9,
                                     "latency_ms": {"batch1_p50": 0.1}}))
    return onnx_path, card_path


def base_runtime(directory: Path, version: str = "1") -> OnnxModel:
    """The node's base version (its spec files), loaded."""
    onnx_path, card_path = write_model(directory, version)
    return OnnxModel(onnx_path, ModelInfo.from_card(card_path))


def trusted(key: Ed25519PrivateKey) -> tuple[str, ...]:
    return (public_key_string(key),)


def publish(repo: Path, key: Ed25519PrivateKey, version: str, *, name: str = NAME,
            task: str = TASK) -> Path:
    """Write and sign ``version`` into the fake repository; returns its directory."""
    vdir = repo / version
    onnx_path, card_path = write_model(vdir, version, name=name, task=task)
    onnx_sha, onnx_size = hash_file(onnx_path)
    card_sha, card_size = hash_file(card_path)
    manifest = VersionManifest(name=name, task=task, version=version, onnx_sha256=onnx_sha,
                               onnx_size=onnx_size, card_sha256=card_sha, card_size=card_size,
                               notes="test", created_at=1.0,
                               validation=Validation("fmnist", "test", 10, 0.9, 1.0))
    signed = sign_manifest(manifest, key)
    (vdir / "signed.json").write_text(json.dumps(signed.to_dict()))
    return vdir


def tamper(path: Path) -> None:
    """Flip one bit in the middle of ``path``."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


class FakeSource:
    """The repository as a node sees it, from a directory (see :func:`publish`).

    ``mid_download`` runs once half of ``model.onnx`` is written (the crash driver dies
    there); ``down`` makes every call fail as an unreachable control plane would."""

    def __init__(self, repo: Path, mid_download: Callable[[], None] | None = None) -> None:
        self.repo = repo
        self.mid_download = mid_download
        self.down = False
        self.manifests = 0
        self.downloads = 0

    async def version_manifest(self, name: str, version: str) -> SignedManifest:
        if self.down:
            raise ControlPlaneError("cannot reach the control plane (test)")
        self.manifests += 1
        path = self.repo / version / "signed.json"
        if not path.exists():
            raise RepositoryError(f"{name} has no version {version!r}")
        return SignedManifest.from_dict(json.loads(path.read_text()))

    async def download_version(self, signed: SignedManifest, dest_dir: Path) -> None:
        if self.down:
            raise ControlPlaneError("cannot reach the control plane (test)")
        self.downloads += 1
        await asyncio.to_thread(self._copy, self.repo / signed.version, dest_dir)

    def _copy(self, src: Path, dest_dir: Path) -> None:
        data = (src / "model.onnx").read_bytes()
        with open(dest_dir / "model.onnx", "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            if self.mid_download is not None:
                self.mid_download()
            f.write(data[len(data) // 2:])
        shutil.copyfile(src / "card.json", dest_dir / "card.json")
