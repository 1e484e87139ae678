"""The zoo's training loop reports on its phase: the batches counted, the epoch and loss as
its status (what `tierlink zoo build` and the demo show while a model trains); the zoo
source builds on the reporter its caller gave the catalog."""

import io
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tierlink.core.progress import Reporter
from tierlink.models.catalog import SourceOptions
from tierlink.models.data import Labelled


def test_training_counts_its_batches_with_the_epoch_and_loss():
    torch = pytest.importorskip("torch")
    from tierlink.zoo.build import train_net
    from tierlink.zoo.profiles import TrainRecipe

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    data = Labelled.of(rng.random((128, 1, 28, 28), dtype=np.float32),
                       rng.integers(0, 10, 128))
    stream = io.StringIO()
    reporter = Reporter(stream, clock=lambda: 0.0, interval_s=0.0, beat_s=None)
    with reporter.phase("fmnist-small") as phase:
        train_net("fmnist-small", "small", TrainRecipe(epochs=2, batch_size=64), data, 7,
                  phase)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "fmnist-small: started"
    counted = [line for line in lines if re.match(r"fmnist-small: \d/4 ", line)]
    assert [line.split()[1] for line in counted] == ["0/4", "1/4", "2/4", "3/4", "4/4"]
    assert counted[0].endswith("; training")  # the total, known once training starts
    assert re.search(r"2/4 \(50%\) 0:00 elapsed, ~0:00 left; epoch 1/2 loss \d+\.\d{3}$",
                     counted[2])
    assert "epoch 2/2" in counted[-1]
    assert lines[-1].startswith("fmnist-small: done in 0:00")


def test_the_zoo_source_builds_on_the_callers_reporter(monkeypatch):
    from tierlink.zoo.source import ZooSource

    asked = []

    def ensure_zoo(task, profile, progress):
        asked.append((task, profile, progress))
        return SimpleNamespace(cards={"fmnist-small": None}, path=lambda n: Path(f"{n}.onnx"),
                               card_path=lambda n: Path(f"{n}.json"))

    monkeypatch.setattr("tierlink.zoo.cache.ensure_zoo", ensure_zoo)
    reporter = Reporter.quiet()
    found = ZooSource(SourceOptions(profile="test", progress=reporter)).resolve(
        ["fmnist-small"])
    assert asked == [("fmnist", "test", reporter)]
    assert found["fmnist-small"].file == Path("fmnist-small.onnx")
