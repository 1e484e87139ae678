"""The zoo's trainer: a zoo net read back from its ONNX file answers as the file does, is
fine-tuned on hard examples and exported again; a graph that is not a zoo net is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tierlink.errors import ZooError
from tierlink.models.data import Labelled
from tierlink.models.evaluate import onnx_logits
from tierlink.retrain import TRAINERS, TrainJob
from tierlink.zoo.cache import ensure_zoo
from tierlink.zoo.retrain import FineTune, fine_tune, sequential_from_onnx

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def small() -> Path:
    return ensure_zoo(task="fmnist", profile="test", progress=False).path("fmnist-small")


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, 28, 28), dtype=np.float32)


def test_a_zoo_net_read_back_from_its_graph_answers_as_the_file_does(small: Path) -> None:
    net = sequential_from_onnx(small)
    x = images(16)
    with torch.no_grad():
        ours = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, onnx_logits(small, x, threads=1), atol=1e-4)


def test_fine_tuning_moves_the_model_toward_the_hard_examples(small: Path,
                                                               tmp_path: Path) -> None:
    x = images(64, seed=1)
    before = onnx_logits(small, x, threads=1).argmax(axis=1)
    target = (before + 1) % 10  # labels the parent gets wrong on every one
    hard = Labelled.of(x, target.astype(np.int64))
    train = Labelled.of(images(256, seed=2) * 0.1, np.zeros(256, np.int64))  # dark: class 0
    out = fine_tune(small, train, hard, tmp_path / "new.onnx",
                    FineTune(epochs=3, max_lr=0.05, batch_size=32, hard_share=0.5,
                             train_samples=256, flips=False))
    after = onnx_logits(out, x, threads=1).argmax(axis=1)
    assert (after == target).mean() >= 0.5 and (before == target).mean() == 0


def test_the_zoo_trainer_takes_a_job(small: Path, tmp_path: Path) -> None:
    x = images(32, seed=3)
    job = TrainJob("fmnist-small", small, small.parent / "card.json",
                   Labelled.of(images(256, seed=4), np.zeros(256, np.int64)),
                   Labelled.of(x, np.ones(32, np.int64)), tmp_path / "model.onnx")
    out = TRAINERS.get("zoo")(job)
    assert out == tmp_path / "model.onnx" and onnx_logits(out, x, threads=1).shape == (32, 10)


def test_a_graph_that_is_not_a_zoo_net_is_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"])], "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(np.zeros(1, np.float32), "unused")])
    path = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(ZooError, match="operator Softmax is not one of a zoo net's"):
        sequential_from_onnx(path)


def test_the_zoo_trainers_options_are_its_settings_and_a_typo_is_named() -> None:
    from tierlink.errors import ConfigError
    from tierlink.zoo.retrain import settings

    assert settings({"epochs": "2", "flips": "false"}) == FineTune(epochs=2, flips=False)
    assert settings({"from_scratch": "true"}).from_scratch
    with pytest.raises(ConfigError, match="no option 'epoch'"):
        settings({"epoch": "2"})
    with pytest.raises(ConfigError, match="max_lr='fast' is not a float"):
        settings({"max_lr": "fast"})
