"""What the engine runs: jobs that feed rows to the model and read their logits.

A ``GenerateJob`` prefills its prompt in fixed chunks, then decodes one token per engine
step until a stop token, a stop sequence, ``max_tokens`` or a cancel; it reports each step
through its ``emit`` callback. A ``VerifyJob`` (speculative decoding, on the verifying node)
feeds the tokens the drafter has not yet sent plus k draft tokens, applies the acceptance
rule, crops the cache back to what was kept and resolves once. Both are written so that a
position's logits come from the same kernels whichever job computed them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import Step
from tierlink.llm.results import Timing
from tierlink.llm.sampling import (
    Proposal,
    SamplingParams,
    Verdict,
    accept_drafts,
    generator,
    sample,
)

PREFILL_CHUNK = 256  # prompt rows per step; fixed, so a prompt always prefills the same way


@dataclass
class Event:
    """One step of a generation: new token ids, or the end (``finish_reason`` set)."""

    tokens: list[int]
    finish_reason: str | None = None  # stop | length | cancelled | error
    error: BaseException | None = None


def prefill_steps(cache: KVCache, tokens: list[int]) -> list[list[int]]:
    """The chunks a prompt is fed in, aligned to the cache's slot positions (a bounded
    cache takes chunks that fit its window)."""
    size = PREFILL_CHUNK
    if cache.bounds.max_tokens is not None:
        size = max(1, min(size, (cache.limit - cache.bounds.sinks) // 2))
    chunks: list[list[int]] = []
    at, pos = 0, cache.length
    while at < len(tokens):
        room = size - pos % size
        chunks.append(tokens[at:at + room])
        at += room
        pos += room
    return chunks


@dataclass
class Decoding:
    """A generation's choices, whichever runtime computes its logits: each row sampled,
    the end at an end-of-sequence token or ``max_tokens``, each token reported through
    ``emit`` (the last with its finish reason)."""

    params: SamplingParams
    emit: Callable[[Event], None]
    eos_ids: frozenset[int]
    timing: Timing
    clock: Callable[[], float] = time.monotonic
    gen: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.gen = generator(self.params.seed)

    def choose(self, row: torch.Tensor) -> int | None:
        """The next token, to feed; None when the generation ended with this row."""
        return self.take(sample(row, self.params, self.gen))

    def take(self, token: int) -> int | None:
        """``token`` chosen (here, or by the upstream of a split): the next token to feed;
        None when the generation ended with it."""
        if self.timing.first_token is None:
            self.timing.first_token = self.clock()
        if token in self.eos_ids and not self.params.ignore_eos:
            self.finish("stop", [])
            return None
        self.timing.generated += 1
        if self.timing.generated >= self.params.max_tokens:
            self.finish("length", [token])
            return None
        self.emit(Event([token]))
        return token

    def finish(self, reason: str, tokens: list[int]) -> None:
        self.timing.finished = self.clock()
        self.emit(Event(tokens, reason))

    def fail(self, exc: BaseException) -> None:
        self.timing.finished = self.clock()
        self.emit(Event([], "error", exc))


@dataclass
class GenerateJob:
    cache: KVCache
    prompt: list[int]
    params: SamplingParams
    emit: Callable[[Event], None]
    eos_ids: frozenset[int]
    clock: Callable[[], float] = time.monotonic
    cancelled: bool = False
    stop_now: bool = False  # set by the caller when a stop *sequence* matched
    fed: list[int] = field(default_factory=list)  # what the cache now holds of this job
    timing: Timing = field(init=False)
    _chunks: list[list[int]] = field(init=False)
    _last: int = field(default=0, init=False)
    _decoding: Decoding = field(init=False)

    def __post_init__(self) -> None:
        # All but the last prompt token prefill in chunks; the last is fed as a decode row,
        # so every row whose logits are read is computed the same way (see VerifyJob).
        self.timing = Timing(self.clock(), prompt_tokens=len(self.prompt))
        self._chunks = prefill_steps(self.cache, self.prompt[:-1])
        self._last = self.prompt[-1]
        self._decoding = Decoding(self.params, self.emit, self.eos_ids, self.timing,
                                  self.clock)

    def next_step(self) -> Step:
        if self._chunks:
            return Step(self.cache, self._chunks[0], block=True)
        return Step(self.cache, [self._last])

    def take(self, logits: torch.Tensor) -> bool:
        """Consume this step's logits; True when the job is finished."""
        if self._chunks:
            self.fed.extend(self._chunks.pop(0))
            return False
        self.fed.append(self._last)
        token = self._decoding.choose(logits[-1])
        if token is None:
            return True
        self._last = token
        return False

    def cancel_if_asked(self) -> bool:
        if self.cancelled or self.stop_now:
            self._decoding.finish("stop" if self.stop_now else "cancelled", [])
            return True
        return False

    def fail(self, exc: BaseException) -> None:
        self._decoding.fail(exc)


@dataclass
class VerifyJob:
    """``pending``: tokens the verifier's cache lacks (the prompt on the first call, else the
    verifier's own token from the last verdict); ``drafts``: the k proposals to judge."""

    cache: KVCache
    pending: list[int]
    drafts: list[Proposal]
    params: SamplingParams
    resolve: Callable[[Verdict | None, BaseException | None], None]
    gen: torch.Generator
    cancelled: bool = False
    kind: str = "verify"
    submitted: float = field(default_factory=time.monotonic)
    _chunks: list[list[int]] = field(init=False)
    _first_row: torch.Tensor | None = field(default=None, init=False)
    _base: int = field(init=False)

    def __post_init__(self) -> None:
        # Every pending token but the last is prefill (as a prompt is); the last rides with
        # the drafts as exact rows, as a decode step would have fed it.
        head = self.pending[:-1]
        self._chunks = prefill_steps(self.cache, head) if len(self.pending) > 1 else []
        self._base = self.cache.length + len(self.pending)

    def next_step(self) -> Step:
        if self._chunks:
            return Step(self.cache, self._chunks[0], block=True)
        tokens = [self.pending[-1], *(d.token for d in self.drafts)]
        return Step(self.cache, tokens, all_logits=True)

    def take(self, logits: torch.Tensor) -> bool:
        if self._chunks:
            self._chunks.pop(0)
            return False
        verdict = accept_drafts(logits, self.drafts, self.params, self.gen)
        self.cache.crop(self._base + verdict.accepted)
        self.resolve(verdict, None)
        return True

    def cancel_if_asked(self) -> bool:
        if self.cancelled:
            self.resolve(None, None)
            return True
        return False

    def fail(self, exc: BaseException) -> None:
        self.resolve(None, exc)
