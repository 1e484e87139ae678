"""The real SmolLM2-135M-Instruct (installed by setup from its package; converted here on
first use when missing), loaded once per session on one thread."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def lm_dir() -> Path:
    from tierlink.llm.weights import install_model

    return install_model("smollm2-135m")


@pytest.fixture(scope="session")
def target(lm_dir: Path):  # -> LlamaModel
    from tierlink.llm.model import LlamaModel

    torch.set_num_threads(1)
    return LlamaModel.load(lm_dir)


@pytest.fixture(scope="session")
def codec(lm_dir: Path):  # -> TextCodec
    from tierlink.llm.text import TextCodec

    return TextCodec(lm_dir)
