"""A language model's card: what it is and how fast it runs on this machine.

Measured once per model directory and machine (``card.json`` beside the weights, keyed by
the weights' size and mtime): parameters, bytes, tokenizer, context length, KV bytes per
token, prefill and decode tokens/s on one thread.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import LlamaModel, Step
from tierlink.llm.text import TextCodec

CARD = "card.json"


def load_or_measure(name: str, directory: Path, model: LlamaModel, codec: TextCodec,
                    precision: str = "fp32") -> dict[str, Any]:
    weights = directory / "model.safetensors"
    key = f"{weights.stat().st_size}-{int(weights.stat().st_mtime)}-{platform.node()}"
    path = directory / (CARD if precision == "fp32" else f"card-{precision}.json")
    try:
        card = dict(json.loads(path.read_text()))
        if card.get("measured_for") == key:
            return card
    except (OSError, ValueError):
        pass
    card = measure(name, directory, model, codec)
    card["precision"] = precision
    card["measured_for"] = key
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(card, indent=2))
    os.replace(tmp, path)
    return card


def measure(name: str, directory: Path, model: LlamaModel, codec: TextCodec,
            prompt_tokens: int = 128, decode_tokens: int = 24) -> dict[str, Any]:
    cfg = model.config
    source = _source(directory)
    prompt = [(17 + 31 * i) % cfg.vocab_size for i in range(prompt_tokens)]
    cache = KVCache(cfg)
    t0 = time.perf_counter()
    model.forward([Step(cache, prompt, block=True)])
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(decode_tokens):
        model.forward([Step(cache, [(prompt[-1] + i) % cfg.vocab_size])])
    decode_s = time.perf_counter() - t0
    return {
        "name": name, "kind": "causal_lm", "architecture": "llama",
        "parameters": model.parameters(),
        "bytes": (directory / "model.safetensors").stat().st_size,
        "source": source,
        "tokenizer": {"kind": codec.name, "vocab_size": codec.vocab_size(),
                      "chat_template": codec.template_text is not None},
        "context_length": cfg.context_length,
        "layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
        "kv_bytes_per_token": cfg.kv_bytes_per_token,
        "prefill_tokens_per_s": round(prompt_tokens / prefill_s, 1),
        "decode_tokens_per_s": round(decode_tokens / decode_s, 1),
        "measured": {"threads": 1, "prompt_tokens": prompt_tokens,
                     "decode_tokens": decode_tokens, "exact": model.exact,
                     "machine": platform.machine()},
    }


def _source(directory: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((directory / "source.json").read_text()))
    except (OSError, ValueError):
        return {}
