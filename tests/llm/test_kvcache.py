"""A bounded KV cache: sinks kept, the window slides, positions stay within the cache."""

from __future__ import annotations

import pytest
import torch

from tierlink.errors import ContextTooLong, InvalidRequest
from tierlink.llm.kvcache import CacheBounds, KVCache
from tierlink.llm.model import Rope
from tierlink.llm.weights import LlamaConfig

CFG = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-5,
                  rope_theta=10000.0, context_length=64, bos_token_id=1, eos_token_ids=(2,))


def _fill(cache: KVCache, rope: Rope, n: int, start_value: float) -> None:
    cache.make_room(n, rope.shift)
    raw = torch.arange(start_value, start_value + n).view(1, n, 1).expand(1, n, 8).clone()
    pos = torch.arange(cache.length, cache.length + n)
    for layer in range(CFG.num_layers):
        cache.write(layer, cache.length, rope.rotate(raw, pos), raw)
    cache.advance(n)


def test_unbounded_cache_grows_and_refuses_past_the_context() -> None:
    rope = Rope(8, 10000.0)
    cache = KVCache(CFG, initial=4)
    _fill(cache, rope, 40, 0.0)
    assert cache.length == 40 and cache.capacity >= 40
    with pytest.raises(ContextTooLong):
        cache.make_room(30, rope.shift)


def test_bounded_cache_keeps_sinks_and_the_latest_window() -> None:
    rope = Rope(8, 10000.0)
    cache = KVCache(CFG, CacheBounds(max_tokens=20, sinks=2, evict_chunk=4))
    for i in range(50):
        _fill(cache, rope, 1, float(i))
    assert cache.length <= 20
    values = cache.v[0][0, :cache.length, 0].tolist()
    assert values[:2] == [0.0, 1.0]  # the sinks
    assert values[-1] == 49.0 and values[2:] == list(range(50 - len(values) + 2, 50))
    # keys were re-rotated to their new slots: equal to rotating the raw value there
    raw = cache.v[0][:, :cache.length]
    expected = rope.rotate(raw, torch.arange(cache.length))
    assert torch.allclose(cache.k[0][:, :cache.length], expected, atol=1e-4)
    assert cache.seen == 50 and cache.evicted == 50 - cache.length


def test_cap_in_bytes_becomes_positions() -> None:
    bounds = CacheBounds.from_bytes(CFG.kv_bytes_per_token * 100, CFG)
    assert bounds.max_tokens == 100
    with pytest.raises(InvalidRequest):
        CacheBounds.from_bytes(CFG.kv_bytes_per_token * 5, CFG)
