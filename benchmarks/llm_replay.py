"""Devices that draft on cores of their own, replayed: the verifier's capacity measured
without the benchmark machine's one spare core deciding it (``llm_capacity.py``).

A replayed device runs the drafting side of speculative decoding against the real verifier
over its real link — the same round loop, the same choice of k (``estimate.speculation``),
drafting ahead or not — but its draft model's proposals are looked up instead of computed:
before the run, the INT8 draft's greedy chains are computed once for every prefix the
answers pass through (the target's greedy answer, computed once too), and the time drafting
would take is slept — the INT8 draft's per-token time measured here on one free core (the
prompt's prefill on the device is not replayed: first tokens come a little early). A
replayed device thus proposes what the real one would, as fast as one with a core of its
own, and spends only its HTTP on this machine. Every verdict is checked against the
target's greedy answer: a verifier that answered otherwise would show as a divergence.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx

CHAIN = 12  # draft tokens looked up per prefix: a round's k, then the next round's ahead


@dataclass(frozen=True)
class Script:
    """One prompt's replay: its token ids, the target's greedy answer, and the draft's
    greedy chain after each prefix ``prompt + answer[:i]``."""

    prompt: str
    ids: tuple[int, ...]
    answer: tuple[int, ...]
    chains: tuple[tuple[int, ...], ...]


def scripts(prompts: list[str], max_tokens: int) -> tuple[list[Script], float]:
    """The replays of ``prompts`` and the draft's measured seconds per token."""
    import torch

    from tierlink.llm.draft import int8_draft
    from tierlink.llm.kvcache import KVCache
    from tierlink.llm.model import LlamaModel, Step
    from tierlink.llm.text import TextCodec
    from tierlink.llm.weights import resolve

    torch.set_num_threads(1)
    directory = resolve("smollm2-135m")
    target = LlamaModel.load(directory)
    draft = int8_draft(LlamaModel.load(directory))
    codec = TextCodec(directory)
    out, step_s = [], []
    for prompt in prompts:
        ids = codec.encode(codec.chat_prompt([{"role": "user", "content": prompt}]))
        answer = _greedy_ignoring_eos(target, ids, max_tokens)
        # as the drafter computes them: the prompt but its last token as one block, then a
        # position at a time (a block's INT8 rows share one activation scale: its logits
        # differ from a row's)
        cache = KVCache(draft.config)
        chains = []
        with torch.inference_mode():
            draft.forward([Step(cache, ids[:-1], block=True)])
            last = ids[-1]
            for i in range(max_tokens + 1):
                base = cache.length
                logits = draft.forward([Step(cache, [last])])[0][-1]
                chain = []
                for _ in range(CHAIN):
                    chain.append(int(torch.argmax(logits)))
                    t0 = time.perf_counter()
                    logits = draft.forward([Step(cache, [chain[-1]])])[0][-1]
                    step_s.append(time.perf_counter() - t0)
                chains.append(tuple(chain))
                cache.crop(base + 1)
                last = answer[i] if i < max_tokens else last
        out.append(Script(prompt, tuple(ids), tuple(answer), tuple(chains)))
    return out, statistics.median(step_s)


def _greedy_ignoring_eos(model: Any, ids: list[int], max_tokens: int) -> list[int]:
    import torch

    from tierlink.llm.kvcache import KVCache
    from tierlink.llm.model import Step

    cache = KVCache(model.config)
    with torch.inference_mode():
        logits = model.forward([Step(cache, ids, block=True)])[0][-1]
        out: list[int] = []
        while len(out) < max_tokens:
            out.append(int(torch.argmax(logits)))
            logits = model.forward([Step(cache, [out[-1]])])[0][-1]
    return out


async def replay(http: httpx.AsyncClient, verify_url: str, script: Script, key: str,
                 draft_s: float, ahead: bool, k_max: int = 8) -> dict[str, Any]:
    """One answer drafted by a replayed device: its timings, rounds and whether every
    verdict was the target's."""
    from tierlink.estimate.speculation import SpecEstimator

    est = SpecEstimator(k_max=k_max)
    n = len(script.answer)
    pos, rounds, drafted, accepted, hits, diverged = 0, 0, 0, 0, 0, None
    ready: list[int] = []
    start = time.perf_counter()
    first = last = None
    while pos < n:
        t0 = time.perf_counter()
        if ready:
            proposals = ready
        else:
            proposals = list(script.chains[pos][:est.next_k(n - pos + 1)])
            await asyncio.sleep(draft_s * len(proposals))
        k = len(proposals)
        t1 = time.perf_counter()
        body = {"session": key, "tokens": [*script.ids, *script.answer[:pos]],
                "drafts": [{"token": t} for t in proposals], "sampling": {"temperature": 0}}
        judging = asyncio.ensure_future(http.post(verify_url, json=body))
        guess: list[int] = []
        if ahead and n - pos > k + 1:
            more = est.next_k(n - pos - k) + 1
            guess = list(script.chains[pos][k:k + more])
            guess = guess[:await _sleep_until(judging, draft_s, len(guess))]
        reply = await judging
        reply.raise_for_status()
        verdict = reply.json()
        tokens = [int(t) for t in verdict["tokens"]]
        expected = list(script.answer[pos:pos + len(tokens)])  # the answer may end first
        if diverged is None and tokens[:len(expected)] != expected:
            diverged = pos + next(i for i, (a, b) in enumerate(zip(tokens, expected,
                                                                   strict=False)) if a != b)
        est.observe(k, len(tokens) - 1, t1 - t0, time.perf_counter() - t1)
        rounds, drafted, accepted = rounds + 1, drafted + k, accepted + len(tokens) - 1
        ready = guess[1:] if len(guess) > 1 and len(tokens) == k + 1 \
            and tokens[-1] == guess[0] else []
        hits += bool(ready)
        pos += len(tokens)
        last = time.perf_counter()
        first = first or last
    await http.delete(f"{verify_url}/{key}")
    return {"prompt": script.prompt, "tokens": n, "ttft_s": (first or start) - start,
            "stream_s": (last or start) - (first or start), "rounds": rounds,
            "drafted": drafted, "accepted": accepted, "ahead_hits": hits,
            "diverged_at": diverged}


async def _sleep_until(judging: asyncio.Future[Any], draft_s: float, tokens: int) -> int:
    """Draft up to ``tokens`` at ``draft_s`` each while the verdict is awaited, stopping
    after the token in hand when it comes (as the drafter does); how many were drafted."""
    for done in range(1, tokens + 1):
        await asyncio.sleep(draft_s)
        if judging.done():
            return done
    return tokens
