"""A language model split at a layer: the device runs the embedding and the first ``cut``
decoder layers and sends each position's hidden state; the upstream runs the rest, with a
KV cache of its own for its layers, and picks the next token.

What crosses the link is not the prompt's text nor its token ids but the hidden states after
``cut`` layers, encoded by a split codec (``split/codecs.py``: ``fp32`` exact, ``fp16``,
``int8`` quantized). **Hidden states carry information about the prompt**: after a few layers
they are close to the token embeddings, and inversion attacks recover much of the text from
them; a split keeps the raw input on the device, not its meaning. A fleet allows it only where
its rule on features leaving a device does (``Privacy.features_allowed``,
``routing.local_features_may_leave``), as for a CNN's split.

Pure of I/O: :func:`split_greedy` returns what the wire carried and the time each side
computed; the caller prices the link. :func:`head_rows` and :func:`tail_rows` are the two
sides as nodes run them (``chat/splitting.py``): a prompt's rows fed as the engine feeds a
prompt (all but the last in fixed chunks, the last as a decode row), so the split's logits
are the unsplit model's wherever the hidden states cross exactly (``fp32``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import LlamaModel, Step
from tierlink.split.codecs import get_codec

__all__ = ["SplitRun", "first_divergence", "greedy", "head_rows", "split_greedy",
           "tail_rows"]


@dataclass(slots=True)
class SplitRun:
    """A split generation: its tokens, the payload of each device → upstream message (the
    prompt's rows first, then one per generated token) and the seconds each side computed
    (head and encode on the device, decode and tail upstream), per message."""

    tokens: list[int] = field(default_factory=list)
    payload_bytes: list[int] = field(default_factory=list)
    device_s: list[float] = field(default_factory=list)
    upstream_s: list[float] = field(default_factory=list)


def greedy(model: LlamaModel, prompt: list[int], max_tokens: int) -> list[int]:
    """The unsplit model's greedy tokens, computed as the split computes them (the prompt
    as one block, then one position per step)."""
    cache = KVCache(model.config)
    logits = model.forward([Step(cache, prompt, block=True)])[0][-1]
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(torch.argmax(logits))
        out.append(token)
        if token in model.config.eos_token_ids:
            break
        logits = model.forward([Step(cache, [token])])[0][-1]
    return out


def split_greedy(device: LlamaModel, upstream: LlamaModel, prompt: list[int], cut: int,
                 codec: str, max_tokens: int) -> SplitRun:
    """Greedy generation with ``device`` running layers below ``cut`` and ``upstream`` the
    rest (the same weights, or one side's own copy), hidden states sent with ``codec``."""
    wire = get_codec(codec)
    head_cache, tail_cache = KVCache(device.config), KVCache(upstream.config)
    run = SplitRun()
    rows, block = prompt, True
    while True:
        began = time.perf_counter()
        hidden = device.head(Step(head_cache, rows, block=block), cut)
        payload = wire.encode(hidden.numpy())
        sent = time.perf_counter()
        received = torch.tensor(wire.decode(payload))
        positions = Step(tail_cache, [-1] * len(rows), block=block)  # the ids stay here
        logits = upstream.tail(positions, received, cut)[-1]
        token = int(torch.argmax(logits))
        run.device_s.append(sent - began)
        run.upstream_s.append(time.perf_counter() - sent)
        run.payload_bytes.append(len(payload))
        run.tokens.append(token)
        if len(run.tokens) >= max_tokens or token in upstream.config.eos_token_ids:
            return run
        rows, block = [token], False


@torch.inference_mode()
def head_rows(model: LlamaModel, cache: KVCache, tokens: list[int], cut: int) -> torch.Tensor:
    """The device's side: ``tokens`` (a prompt, or one new token) through the embedding and
    layers below ``cut``; their hidden states, rows × hidden."""
    from tierlink.llm.jobs import prefill_steps

    parts = [model.head(Step(cache, chunk, block=True), cut)
             for chunk in prefill_steps(cache, tokens[:-1])]
    parts.append(model.head(Step(cache, tokens[-1:]), cut))
    return torch.cat(parts)


@torch.inference_mode()
def tail_rows(model: LlamaModel, cache: KVCache, hidden: torch.Tensor, cut: int
              ) -> torch.Tensor:
    """The upstream's side: the rest of the model over ``hidden`` (fed as
    :func:`head_rows` fed their tokens); the logits of the last row."""
    from tierlink.llm.jobs import prefill_steps

    chunks = [(c, True) for c in prefill_steps(cache, [-1] * (hidden.shape[0] - 1))]
    at, logits = 0, None
    for chunk, block in [*chunks, ([-1], False)]:
        logits = model.tail(Step(cache, chunk, block=block), hidden[at:at + len(chunk)], cut)
        at += len(chunk)
    assert logits is not None
    return logits[-1]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The index of the first token where ``a`` and ``b`` differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
