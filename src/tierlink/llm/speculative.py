"""Speculative decoding across tiers, the drafting side (a device).

Each round the device drafts k tokens with its own small model, sends its sequence and the k
proposals to the verifier (an edge or cloud node holding the target), and keeps what comes
back: the accepted prefix plus the verifier's own next token. Every output token is the
target's decision, so greedy output equals the target's own greedy output token for token,
and sampled output keeps the target's distribution (``sampling.accept_drafts``). k adapts to
the acceptance rate, the draft's speed and the round trip (``estimate.speculation``). When
the verifier cannot be reached the device finishes with its own draft model and the answer
says ``degraded``.

Drafting ahead (``ahead``): while a round's proposals are being verified — a round trip
and a verifier pass the device would otherwise sit out — the device drafts on as if every
proposal will be accepted: first its guess at the verifier's own next token, then the next
round's proposals after it. When the verdict takes every proposal and its next token is the
guess, those proposals go at once (no drafting between rounds); otherwise they are dropped
(the draft cache is cut back) and the next round drafts as usual. The output is the
target's either way; what drafting ahead costs is device compute on rounds it guessed wrong.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tierlink.errors import TierlinkError
from tierlink.estimate.speculation import SpecEstimator
from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import LlamaModel, Step
from tierlink.llm.results import Chunk, Generation, Timing
from tierlink.llm.sampling import Proposal, SamplingParams, Verdict, generator, propose
from tierlink.llm.text import Detokenizer, TextCodec

# (sequence so far, proposals, sampling) -> the verifier's verdict
Verifier = Callable[[list[int], list[Proposal], SamplingParams], Awaitable[Verdict]]

DRAFT_TOP_K = 64  # a sampled draft proposes from its top 64 tokens: its q travels sparse


@dataclass
class SpecReport:
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    mean_k: float = 0.0
    degraded: bool = False
    reason: str | None = None
    draft_s: float = 0.0
    verify_s: float = 0.0
    ks: list[int] = field(default_factory=list)
    ahead_hits: int = 0  # rounds whose proposals were drafted during the round before


class DraftModel(Protocol):
    """What drafts: proposals after a sequence, on whichever runtime holds the draft."""

    def new_cache(self) -> Any:
        """An answer's own draft state (passed back to every :meth:`propose` of it)."""

    def propose(self, cache: Any, tokens: list[int], k: int, params: SamplingParams,
                gen: torch.Generator, stop: threading.Event | None = None) -> list[Proposal]:
        """k proposals after ``tokens`` (fewer, at least one, once ``stop`` is set)."""


class TorchDraft:
    """A draft on the torch runtime (``llm/model.py``): one KV cache per answer."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model

    def new_cache(self) -> KVCache:
        return KVCache(self.model.config)

    @torch.inference_mode()
    def propose(self, cache: KVCache, tokens: list[int], k: int, params: SamplingParams,
                gen: torch.Generator, stop: threading.Event | None = None) -> list[Proposal]:
        """Feed what the draft cache lacks, then propose k tokens (the last one unfed)."""
        if cache.length > len(tokens) - 1:
            cache.crop(len(tokens) - 1)
        pending = tokens[cache.length:]
        if len(pending) > 1:
            self.model.forward([Step(cache, pending[:-1], block=True)])
        proposals: list[Proposal] = []
        last = pending[-1]
        for _ in range(k):
            if proposals and stop is not None and stop.is_set():
                break
            logits = self.model.forward([Step(cache, [last])])[0][-1]
            proposal = propose(logits, params, gen)
            proposals.append(proposal)
            last = proposal.token
        return proposals


class SpeculativeDrafter:
    """One device's draft model; drafts run one at a time in a worker thread."""

    def __init__(self, draft: LlamaModel | DraftModel, codec: TextCodec, k_max: int = 8,
                 ahead: bool = True) -> None:
        self.draft: DraftModel = TorchDraft(draft) if isinstance(draft, LlamaModel) else draft
        self.codec = codec
        self.k_max = k_max
        self.ahead = ahead  # draft the next round while this one is verified
        self._lock = asyncio.Lock()

    async def generate(self, prompt: list[int], params: SamplingParams, verify: Verifier,
                       report: Generation, spec: SpecReport, ahead: bool | None = None,
                       ) -> AsyncIterator[Chunk]:
        """The answer's chunks; ``ahead`` overrides :attr:`ahead` for this answer."""
        ahead = self.ahead if ahead is None else ahead
        cache = self.draft.new_cache()
        draft_params = params if params.greedy else _with_top_k(params, DRAFT_TOP_K)
        gen = generator(params.seed)
        est = SpecEstimator(k_max=self.k_max)
        tokens = list(prompt)
        out: list[int] = []
        detok = Detokenizer(self.codec, params.stop)
        report.prompt_tokens = len(prompt)
        start = time.monotonic()
        finish: str | None = None
        drafted: list[Proposal] = []  # during the last round, for this one
        while finish is None:
            t0 = time.monotonic()
            proposals = drafted or await self._drafted(
                cache, tokens, est.next_k(params.max_tokens - len(out) + 1), draft_params, gen)
            k = len(proposals)
            t1 = time.monotonic()
            spec.draft_s += t1 - t0
            judging = asyncio.ensure_future(self._judge(tokens, proposals, params, verify,
                                                        spec))
            guess: list[Proposal] = []
            try:
                if ahead and not spec.degraded and params.max_tokens - len(out) > k + 1:
                    guess = await self._drafted(
                        cache, [*tokens, *(p.token for p in proposals)],
                        est.next_k(params.max_tokens - len(out) - k) + 1, draft_params, gen,
                        until=judging)
                new = await judging
            finally:
                judging.cancel()  # the answer was abandoned halfway: nothing waits for it
            spec.verify_s += time.monotonic() - t1
            if not spec.degraded:
                accepted = len(new) - 1
                est.observe(k, accepted, t1 - t0, time.monotonic() - t1)
                spec.drafted += k
                spec.accepted += accepted
                spec.rounds += 1
            drafted = guess[1:] if len(guess) > 1 and len(new) == k + 1 \
                and new[-1] == guess[0].token and not spec.degraded else []
            spec.ahead_hits += bool(drafted)
            new, finish = self._cut(new, out, params)
            tokens.extend(new)
            out.extend(new)
            text = detok.push(new)
            if detok.stopped:
                finish = "stop"
            if report.timing is None and out:
                report.timing = Timing(start, first_token=time.monotonic())
            report.completion_tokens = len(out)
            if finish is not None:
                text += detok.flush()
            report.text.append(text)
            if text or finish:
                yield Chunk(text, new, finish)
        if report.timing is not None:
            report.timing.finished = time.monotonic()
            report.timing.generated = len(out)
        report.finish_reason = finish
        spec.ks = est.ks
        spec.mean_k = est.mean_k

    async def _drafted(self, cache: Any, tokens: list[int], k: int,
                       params: SamplingParams, gen: torch.Generator,
                       until: asyncio.Future[Any] | None = None) -> list[Proposal]:
        """k proposals after ``tokens`` (drafts run one at a time, in a worker thread);
        with ``until``, fewer once it is done (at least one)."""
        stop = threading.Event()
        if until is not None:
            until.add_done_callback(lambda _: stop.set())
        async with self._lock:
            return await asyncio.to_thread(self.draft.propose, cache, tokens, k, params, gen,
                                           stop)

    async def _judge(self, tokens: list[int], proposals: list[Proposal],
                     params: SamplingParams, verify: Verifier, spec: SpecReport) -> list[int]:
        if spec.degraded:
            return [p.token for p in proposals]
        try:
            verdict = await verify(tokens, proposals, params)
        except (TimeoutError, TierlinkError, OSError) as exc:
            spec.degraded = True  # the link or the verifier is gone: go on with the draft
            spec.reason = f"verifier unavailable: {exc}"
            return [p.token for p in proposals]
        return list(verdict.tokens)

    def _cut(self, new: list[int], out: list[int],
             params: SamplingParams) -> tuple[list[int], str | None]:
        for i, t in enumerate(new):
            if t in self.codec.eos_ids and not params.ignore_eos:
                return new[:i], "stop"
        room = params.max_tokens - len(out)
        if len(new) >= room:
            return new[:room], "length"
        return new, None


def _with_top_k(params: SamplingParams, top_k: int) -> SamplingParams:
    return SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                          top_p=params.top_p, top_k=top_k, seed=params.seed, stop=params.stop,
                          ignore_eos=params.ignore_eos)
