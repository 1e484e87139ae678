"""A language model's card: what it is and how fast it runs on this machine.

Measured once per model directory and machine (``card.json`` beside the weights, keyed by
the weights' size and mtime): parameters, bytes, tokenizer, context length, KV bytes per
token, prefill and decode tokens/s on one thread.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tierlink.durable import read_json
from tierlink.errors import ModelError
from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import LlamaModel, Step
from tierlink.llm.text import TextCodec
from tierlink.llm.weights import WEIGHTS
from tierlink.models.card import LanguageInfo, ModelCard, load_card, save_card

CARD = "card.json"


def load_or_measure(name: str, directory: Path, model: LlamaModel, codec: TextCodec,
                    precision: str = "fp32") -> ModelCard:
    """The card beside the weights if it was measured for these weights on this machine;
    else measured now and written there."""
    key = measured_for(directory / WEIGHTS)
    path = directory / (CARD if precision == "fp32" else f"card-{precision}.json")
    return cached_card(path, key, lambda: measure(name, directory, model, codec,
                                                  precision=precision, key=key))


def measured_for(weights: Path) -> str:
    """What a card's measurement holds for: these weights (size, mtime) on this machine."""
    stat = weights.stat()
    return f"{stat.st_size}-{int(stat.st_mtime)}-{platform.node()}"


def cached_card(path: Path, key: str, measure: Callable[[], ModelCard]) -> ModelCard:
    """The card at ``path`` if it was measured for ``key``; else ``measure()``'s, written
    there (a read-only model directory: measured again on the next load)."""
    try:
        card = load_card(path)
        if card.language is not None and card.language.measured_for == key:
            return card
    except ModelError:
        pass
    card = measure()
    try:
        save_card(card, path)
    except OSError:
        pass
    return card


def measure(name: str, directory: Path, model: LlamaModel, codec: TextCodec,
            prompt_tokens: int = 128, decode_tokens: int = 24, *, precision: str = "fp32",
            key: str = "") -> ModelCard:
    cfg = model.config
    prompt = [(17 + 31 * i) % cfg.vocab_size for i in range(prompt_tokens)]
    cache = KVCache(cfg)
    t0 = time.perf_counter()
    model.forward([Step(cache, prompt, block=True)])
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(decode_tokens):
        model.forward([Step(cache, [(prompt[-1] + i) % cfg.vocab_size])])
    decode_s = time.perf_counter() - t0
    language = LanguageInfo(
        architecture="llama", context_length=cfg.context_length, layers=cfg.num_layers,
        hidden_size=cfg.hidden_size, kv_bytes_per_token=cfg.kv_bytes_per_token,
        prefill_tokens_per_s=round(prompt_tokens / prefill_s, 1),
        decode_tokens_per_s=round(decode_tokens / decode_s, 1),
        tokenizer=MappingProxyType({"kind": codec.name, "vocab_size": codec.vocab_size(),
                                    "chat_template": codec.template_text is not None}),
        source=MappingProxyType(_source(directory)),
        measured=MappingProxyType({"threads": 1, "prompt_tokens": prompt_tokens,
                                   "decode_tokens": decode_tokens, "exact": model.exact,
                                   "machine": platform.machine()}),
        measured_for=key)
    return ModelCard(name=name, task="chat", version="1", format="llm", file=WEIGHTS,
                     params=model.parameters(), size_bytes=(directory / WEIGHTS).stat().st_size,
                     precision=precision, language=language)


def _source(directory: Path) -> dict[str, Any]:
    try:
        data = read_json(directory / "source.json", "model source")
    except ModelError:
        return {}
    return dict(data) if isinstance(data, dict) else {}
