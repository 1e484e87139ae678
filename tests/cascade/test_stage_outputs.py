"""A model's raw outputs on a split, kept by ``cascade/stages.py``: tuning again reads them
instead of running the model again; another model file or other inputs are run afresh."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tierlink.cascade.stages import _outputs
from tierlink.models.catalog import Resolved
from tierlink.models.data import Labelled
from tierlink.models.tensors import TensorDecl


class Counting:
    """A runtime that doubles its input, counting its calls."""

    inputs = (TensorDecl("x", "FP32", (-1, 2)),)

    def __init__(self) -> None:
        self.calls = 0

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        return {"logits": feed["x"] * 2}


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Resolved:
    monkeypatch.setenv("TIERLINK_HOME", str(tmp_path / "home"))
    (tmp_path / "m.onnx").write_bytes(b"graph one")
    return Resolved("m", tmp_path / "m.onnx", tmp_path / "card.json", "store")


def test_the_outputs_are_run_once_per_model_and_data(model: Resolved, tmp_path: Path) -> None:
    split = Labelled.of(np.arange(8, dtype=np.float32).reshape(4, 2), np.zeros(4), "x")
    rt = Counting()
    first = _outputs(model, rt, split)
    again = _outputs(model, rt, split)
    assert rt.calls == 1
    np.testing.assert_array_equal(first["logits"], again["logits"])
    other = Labelled.of(np.ones((4, 2), dtype=np.float32), np.zeros(4), "x")
    assert _outputs(model, rt, other)["logits"].tolist() == [[2.0, 2.0]] * 4 and rt.calls == 2
    model.file.write_bytes(b"graph two")  # a new version of the model
    _outputs(model, rt, split)
    assert rt.calls == 3
    assert len(list((tmp_path / "home" / "cache" / "outputs").glob("*.npz"))) == 3
