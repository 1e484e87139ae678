"""The engine and runtime on the real model: continuous batching, stops, cancels, sessions,
and speculative decoding whose greedy output equals the target's own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tierlink.errors import ContextTooLong, UpstreamUnavailable
from tierlink.llm.draft import int8_draft
from tierlink.llm.runtime import Generation, LanguageModel
from tierlink.llm.sampling import Proposal, SamplingParams, Verdict
from tierlink.llm.source import LMSource
from tierlink.llm.speculative import SpecReport, SpeculativeDrafter

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three fruits.", "How do I boil an egg?"]


@pytest.fixture(scope="module")
def lm(target, codec) -> Iterator[LanguageModel]:
    runtime = LanguageModel(LMSource("smollm2", "smollm2-135m"), target, codec, card={})
    runtime.start()
    yield runtime
    runtime.stop()


async def _text(lm: LanguageModel, prompt: str, params: SamplingParams = GREEDY,
                session: str | None = None, report: Generation | None = None) -> str:
    ids = lm.chat_ids([{"role": "user", "content": prompt}])
    return "".join([c.text async for c in lm.generate(ids, params, session, report)])


def test_concurrent_generations_equal_sequential_ones(lm: LanguageModel) -> None:
    async def run() -> tuple[list[str], list[str]]:
        alone = [await _text(lm, p) for p in PROMPTS]
        together = await asyncio.gather(*[_text(lm, p) for p in PROMPTS])
        return alone, list(together)
    alone, together = asyncio.run(run())
    assert alone == together
    assert "Paris" in alone[0]


def test_stop_sequences_and_max_tokens(lm: LanguageModel) -> None:
    free = asyncio.run(_text(lm, PROMPTS[1], SamplingParams(max_tokens=24, temperature=0)))
    stop = free[8:12]  # a piece from the middle of the free answer (may span tokens)
    report = Generation()
    text = asyncio.run(_text(lm, PROMPTS[1], SamplingParams(max_tokens=24, temperature=0.0,
                                                            stop=(stop,)), report=report))
    assert text == free[:free.index(stop)] and report.finish_reason == "stop"
    report = Generation()
    asyncio.run(_text(lm, "Tell me a long story.", SamplingParams(max_tokens=5, temperature=0),
                      report=report))
    assert report.finish_reason == "length" and report.completion_tokens == 5


def test_closing_the_stream_cancels_and_the_engine_keeps_serving(lm: LanguageModel) -> None:
    async def run() -> str:
        ids = lm.chat_ids([{"role": "user", "content": "Tell me a long story."}])
        stream = lm.generate(ids, SamplingParams(max_tokens=200, temperature=0))
        async for _ in stream:
            break
        await stream.aclose()
        return await _text(lm, PROMPTS[0])
    assert "Paris" in asyncio.run(run())
    # The engine thread counts its sequences right after it hands out the last token, so
    # the caller may see its answer a moment before the count; it must reach 0.
    deadline = time.monotonic() + 5.0
    while lm.engine.stats.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lm.engine.stats.running == 0


def test_a_session_reuses_its_cache_on_the_next_turn(lm: LanguageModel) -> None:
    async def run() -> Generation:
        first = [{"role": "user", "content": "My name is Ada."}]
        ids = lm.chat_ids(first)
        answer = "".join([c.text async for c in lm.generate(ids, GREEDY, "conv-1")])
        second = [*first, {"role": "assistant", "content": answer},
                  {"role": "user", "content": "What is my name?"}]
        report = Generation()
        async for _ in lm.generate(lm.chat_ids(second), GREEDY, "conv-1", report):
            pass
        return report
    report = asyncio.run(run())
    assert report.cached_tokens >= 20


def test_a_prompt_over_the_context_is_refused(lm: LanguageModel) -> None:
    with pytest.raises(ContextTooLong):
        lm.check_length(list(range(8190)), SamplingParams(max_tokens=16))


def _speculate(lm: LanguageModel, drafter: SpeculativeDrafter, prompt: str,
               params: SamplingParams, verify) -> tuple[str, SpecReport]:
    async def run() -> tuple[str, SpecReport]:
        spec = SpecReport()
        ids = lm.chat_ids([{"role": "user", "content": prompt}])
        pieces = [c.text async for c in drafter.generate(ids, params, verify, Generation(),
                                                         spec)]
        return "".join(pieces), spec
    return asyncio.run(run())


@pytest.mark.parametrize("ahead", [False, True])
def test_speculative_greedy_equals_target_greedy(lm: LanguageModel, target, codec,
                                                 ahead: bool) -> None:
    drafter = SpeculativeDrafter(int8_draft(target), codec, ahead=ahead)
    hits = 0
    for i, prompt in enumerate(PROMPTS[:2]):  # two answers: a dozen rounds or more each
        async def verify(tokens: list[int], drafts: list[Proposal], params: SamplingParams,
                         key: str = f"dev:{i}") -> Verdict:
            if ahead:  # a round trip: time to draft the next round ahead
                await asyncio.sleep(0.15)
            return await lm.verify(key, tokens, drafts, params)
        own = asyncio.run(_text(lm, prompt))
        spec_text, spec = _speculate(lm, drafter, prompt, GREEDY, verify)
        assert spec_text == own
        assert spec.rounds > 0 and 0 < spec.accepted <= spec.drafted
        assert not spec.degraded
        assert lm.release(f"dev:{i}") and f"dev:{i}" not in lm.verifiers  # cache freed
        hits += spec.ahead_hits
    # drafted ahead: some rounds' proposals were ready when their round began
    assert (hits > 0) == ahead


def test_a_lost_verifier_degrades_to_the_draft(lm: LanguageModel, target, codec) -> None:
    draft = int8_draft(target)
    drafter = SpeculativeDrafter(draft, codec)

    async def gone(*_: object) -> Verdict:
        raise UpstreamUnavailable("link down")
    text, spec = _speculate(lm, drafter, PROMPTS[0], GREEDY, gone)
    assert spec.degraded and "link down" in (spec.reason or "")
    assert text  # the device answered on its own
