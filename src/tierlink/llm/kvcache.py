"""The keys and values one sequence has seen, every layer — bounded or not.

Keys are stored rotated (RoPE) at their *slot* position, so attention reads them as they are.
An unbounded cache grows as the sequence does. A bounded one (``max_tokens``) keeps the first
``sinks`` positions (attention sinks, StreamingLLM) and a sliding window of the latest ones:
when a step would overflow it, the oldest window positions are dropped in one chunk and the
kept window keys are rotated back by the shift, so slot positions stay contiguous and the
model never sees a position beyond the cache's size, however long the conversation runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tierlink.errors import ContextTooLong, InvalidRequest
from tierlink.llm.weights import LlamaConfig

# Rotates keys (heads, n, head_dim) by a signed position shift (the model's RoPE).
Rerotate = Callable[[torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True, slots=True)
class CacheBounds:
    """``max_tokens`` None: unbounded (up to the model's context length)."""

    max_tokens: int | None = None
    sinks: int = 4
    evict_chunk: int = 64  # positions dropped at once when the window is full

    @classmethod
    def from_bytes(cls, max_bytes: int, config: LlamaConfig, sinks: int = 4) -> CacheBounds:
        tokens = max_bytes // config.kv_bytes_per_token
        if tokens < sinks + 16:
            raise InvalidRequest(
                f"a KV cache of {max_bytes} bytes holds {tokens} positions of this model; "
                f"at least {sinks + 16} are needed",
                hint=f"raise the cap (one position costs {config.kv_bytes_per_token} bytes)")
        return cls(max_tokens=tokens, sinks=sinks, evict_chunk=max(1, min(64, tokens // 8)))


class KVCache:
    """One sequence's cache: ``k[layer]``, ``v[layer]`` of shape (kv_heads, capacity, head_dim)."""

    def __init__(self, config: LlamaConfig, bounds: CacheBounds | None = None,
                 initial: int = 64) -> None:
        self.config = config
        self.bounds = bounds or CacheBounds()
        limit = self.bounds.max_tokens or config.context_length
        cap = min(initial, limit)
        shape = (config.num_kv_heads, cap, config.head_dim)
        self.k = [torch.zeros(shape) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape) for _ in range(config.num_layers)]
        self.length = 0  # slots in use
        self.seen = 0  # tokens this sequence has fed in total (evicted ones included)
        self.evicted = 0

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    @property
    def limit(self) -> int:
        return self.bounds.max_tokens or self.config.context_length

    def bytes_in_use(self) -> int:
        return self.length * self.config.kv_bytes_per_token

    def bytes_reserved(self) -> int:
        return self.capacity * self.config.kv_bytes_per_token

    def make_room(self, n: int, rerotate: Rerotate) -> None:
        """Ensure ``n`` more positions fit: grow, or (bounded) evict the oldest window chunk."""
        if self.length + n > self.limit:
            if self.bounds.max_tokens is None:
                raise ContextTooLong(
                    f"the sequence would reach {self.length + n} tokens; the model's context "
                    f"length is {self.config.context_length}",
                    hint="shorten the prompt or lower max_tokens")
            self._evict(self.length + n - self.limit, rerotate)
        need = self.length + n
        if need > self.capacity:
            self._grow(min(max(need, 2 * self.capacity), self.limit))

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        for store in (self.k, self.v):
            for i, t in enumerate(store):
                store[i] = torch.cat([t, t.new_zeros(t.shape[0], extra, t.shape[2])], dim=1)

    def _evict(self, overflow: int, rerotate: Rerotate) -> None:
        sinks = self.bounds.sinks
        drop = max(overflow, self.bounds.evict_chunk)
        drop = min(drop, self.length - sinks)
        if drop <= 0 or self.limit - sinks < overflow:
            raise InvalidRequest(
                f"one step of {overflow + self.length} tokens does not fit a window of "
                f"{self.limit} positions", hint="send the prompt in a larger cache or shorter")
        keep_from, end = sinks + drop, self.length
        for layer in range(self.config.num_layers):
            kept_k = rerotate(self.k[layer][:, keep_from:end], -drop)
            self.k[layer][:, sinks:end - drop] = kept_k
            self.v[layer][:, sinks:end - drop] = self.v[layer][:, keep_from:end].clone()
        self.length -= drop
        self.evicted += drop

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Rows (kv_heads, n, head_dim) at slots ``start..start+n``."""
        n = k.shape[1]
        self.k[layer][:, start:start + n] = k
        self.v[layer][:, start:start + n] = v

    def advance(self, n: int) -> None:
        self.length += n
        self.seen += n

    def crop(self, length: int) -> None:
        """Forget the slots from ``length`` on (draft tokens the verifier rejected)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} to {length}")
        self.seen -= self.length - length
        self.length = length
