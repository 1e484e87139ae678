"""The third-party runtime package of ``examples/runtime/`` (installed with ``pip install
-e`` by setup): format ``pt2`` registered by its entry point, a ``torch.export`` program
served through tierlink's runtime registry with the signature read off the file, a wrong
tensor refused before PyTorch sees it, a file that is no program refused naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tierlink.errors import ModelError, TensorError
from tierlink.models import runtimes
from tierlink.models.card import ModelCard, save_card
from tierlink.models.layout import CARD_FILE
from tierlink.models.tensors import TensorDecl

torch.set_num_threads(1)


def program(directory: Path, net: nn.Module) -> Path:
    """``net`` exported with a free batch dimension, its card beside it; the card's path."""
    batch = torch.export.Dim("batch", min=1, max=256)
    exported = torch.export.export(net, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(exported, str(directory / "model.pt2"))
    save_card(ModelCard("lin", "t", "1", format="pt2", file="model.pt2"),
              directory / CARD_FILE)
    return directory / CARD_FILE


def test_the_package_registers_format_pt2() -> None:
    from tierlink_example_runtime import load

    assert runtimes.registry().get("pt2") is load


def test_a_program_is_served_with_its_signature_read_off_the_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = nn.Linear(4, 3).eval()
    model = runtimes.load(runtimes.LoadSpec(program(tmp_path, net)))
    assert model.inputs == (TensorDecl("input", "FP32", (-1, 4)),)
    assert model.outputs == (TensorDecl("output", "FP32", (-1, 3)),)
    assert (model.info.name, model.platform) == ("lin", "pytorch")
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model.infer({"input": x})["output"], want, rtol=1e-5, atol=1e-6)


def test_a_wrong_tensor_is_refused_before_pytorch_sees_it(tmp_path: Path) -> None:
    model = runtimes.load(runtimes.LoadSpec(program(tmp_path, nn.Linear(4, 3).eval())))
    with pytest.raises(TensorError, match="shape"):
        model.infer({"input": np.zeros((2, 5), np.float32)})
    with pytest.raises(TensorError, match="FP32"):
        model.infer({"input": np.zeros((2, 4), np.float64)})


def test_a_file_that_is_no_program_is_refused_naming_it(tmp_path: Path) -> None:
    card = program(tmp_path, nn.Linear(4, 3).eval())
    (tmp_path / "model.pt2").write_bytes(b"not a program")
    with pytest.raises(ModelError, match=r"model\.pt2 is not a torch\.export program"):
        runtimes.load(runtimes.LoadSpec(card))
