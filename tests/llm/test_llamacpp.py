"""The llama.cpp runtime on the packaged GGUF as it ships (SmolLM2 Q4_1): its card, greedy
output equal to llama-cpp-python's own greedy decoding, conversations kept between turns,
stops and cancels, and speculative decoding with llama.cpp on either side — drafting for
the torch target (output identical to the target's), or verifying the torch draft (output
reported against llama.cpp's own greedy output: its batched rows may round differently)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tierlink.errors import ContextTooLong, PackageRefused, SessionNotFound
from tierlink.llm.llamacpp import LlamaCppModel
from tierlink.llm.results import Generation
from tierlink.llm.runtime import LanguageModel
from tierlink.llm.sampling import Proposal, SamplingParams, Verdict
from tierlink.llm.source import LMSource
from tierlink.llm.speculative import SpecReport, SpeculativeDrafter

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module", autouse=True)
def llama_cpp() -> Any:
    """The bindings, checked when a test here runs (CI deselects these while it builds
    them: a module-level skip would fail its collection)."""
    return pytest.importorskip("llama_cpp", reason="the llama.cpp runtime is built by "
                                                   "./scripts/setup.sh --llama")

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three fruits."]


@pytest.fixture(scope="module")
def q4() -> Iterator[LlamaCppModel]:
    model = LlamaCppModel.load(LMSource("q4", "smollm2-135m", runtime="llama.cpp"))
    model.start()
    yield model
    model.stop()


@pytest.fixture(scope="module")
def fp32(target, codec) -> Iterator[LanguageModel]:
    model = LanguageModel(LMSource("fp32", "smollm2-135m"), target, codec, card={})
    model.start()
    yield model
    model.stop()


def _ids(model: LlamaCppModel | LanguageModel, prompt: str) -> list[int]:
    return model.chat_ids([{"role": "user", "content": prompt}])


async def _tokens(model: LlamaCppModel | LanguageModel, ids: list[int],
                  params: SamplingParams = GREEDY, session: str | None = None,
                  report: Generation | None = None) -> list[int]:
    return [t async for c in model.generate(ids, params, session, report) for t in c.tokens]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return at if at is not None or len(a) == len(b) else min(len(a), len(b))


def test_the_card_is_the_gguf_as_it_ships_measured_on_llama_cpp(q4: LlamaCppModel,
                                                                lm_dir: Path) -> None:
    card = q4.card
    assert card.format == "gguf" and card.precision == "q4_1"
    assert card.file.endswith(".gguf") and q4.gguf.name == card.file
    lang = card.language
    assert lang is not None and lang.measured["runtime"] == "llama.cpp"
    assert lang.decode_tokens_per_s > 0 and lang.prefill_tokens_per_s > 0
    # a quarter of the torch runtime's FP32 weights, or less
    assert lang.measured["model_bytes"] < (lm_dir / "model.safetensors").stat().st_size / 4


def test_greedy_output_equals_llama_cpp_python_s_own(q4: LlamaCppModel,
                                                    llama_cpp: Any) -> None:
    ref = llama_cpp.Llama(str(q4.gguf), n_ctx=512, n_threads=1, verbose=False)
    try:
        for prompt in PROMPTS:
            ids = _ids(q4, prompt)
            theirs: list[int] = []
            for token in ref.generate(ids, temp=0.0, top_k=1, reset=True):
                if token in q4.codec.eos_ids or len(theirs) == GREEDY.max_tokens:
                    break
                theirs.append(token)
            assert asyncio.run(_tokens(q4, ids)) == theirs
    finally:
        ref.close()


def test_a_conversation_is_kept_between_turns_beside_another(q4: LlamaCppModel) -> None:
    async def run() -> tuple[Generation, list[int], list[int]]:
        first = _ids(q4, PROMPTS[0])
        answer = await _tokens(q4, first, session="a")
        await _tokens(q4, _ids(q4, PROMPTS[1]), session="b")  # b takes the context
        history = q4.chat_ids([{"role": "user", "content": PROMPTS[0]},
                               {"role": "assistant", "content": q4.codec.decode(answer)},
                               {"role": "user", "content": "Is it a big city?"}])
        report = Generation()
        kept = await _tokens(q4, history, session="a", report=report)
        fresh = await _tokens(q4, history)
        return report, kept, fresh
    report, kept, fresh = asyncio.run(run())
    assert report.cached_tokens > 20  # a's first turn was restored, not prefilled
    assert kept == fresh and kept
    assert "a" in q4.sessions and "b" in q4.sessions


def test_stops_lengths_and_cancels(q4: LlamaCppModel) -> None:
    ids = _ids(q4, PROMPTS[1])
    free = q4.codec.decode(asyncio.run(_tokens(q4, ids)))
    stop = free[8:12]
    report = Generation()
    params = SamplingParams(max_tokens=24, temperature=0.0, stop=(stop,))
    asyncio.run(_tokens(q4, ids, params, report=report))
    assert "".join(report.text) == free[:free.index(stop)] and report.finish_reason == "stop"
    report = Generation()
    asyncio.run(_tokens(q4, ids, SamplingParams(max_tokens=5, temperature=0.0),
                        report=report))
    assert report.finish_reason == "length" and report.completion_tokens == 5

    async def leave_early() -> None:
        stream = q4.generate(ids, SamplingParams(max_tokens=200, temperature=0.0))
        async for _ in stream:
            break
        await stream.aclose()
    asyncio.run(leave_early())
    assert q4.codec.decode(asyncio.run(_tokens(q4, ids))) == free  # still serving


def test_what_it_refuses(q4: LlamaCppModel) -> None:
    with pytest.raises(ContextTooLong):
        q4.check_length([1] * q4.context_length, GREEDY)
    assert q4.held("a") is None
    with pytest.raises(SessionNotFound):
        asyncio.run(q4.export("a", "int8"))
    with pytest.raises(PackageRefused):
        asyncio.run(q4.adopt("a", b"package"))


async def _speculate(drafter: SpeculativeDrafter, verifier: LlamaCppModel | LanguageModel,
                     ids: list[int], key: str) -> tuple[list[int], SpecReport]:
    async def verify(tokens: list[int], drafts: list[Proposal],
                     params: SamplingParams) -> Verdict:
        return await verifier.verify(key, tokens, drafts, params)
    spec = SpecReport()
    out = [t async for c in drafter.generate(ids, GREEDY, verify, Generation(), spec)
           for t in c.tokens]
    verifier.release(key)
    return out, spec


def test_llama_cpp_drafts_for_the_torch_target(q4: LlamaCppModel,
                                               fp32: LanguageModel) -> None:
    drafter = SpeculativeDrafter(q4.draft_model(), q4.codec)
    for i, prompt in enumerate(PROMPTS[:2]):
        ids = _ids(fp32, prompt)
        out, spec = asyncio.run(_speculate(drafter, fp32, ids, f"q4:{i}"))
        assert out == asyncio.run(_tokens(fp32, ids))  # the target's own greedy output
        assert spec.rounds > 0 and spec.accepted > 0 and not spec.degraded


def test_llama_cpp_verifies_the_torch_draft(q4: LlamaCppModel, target, codec) -> None:
    from tierlink.llm.draft import int8_draft

    drafter = SpeculativeDrafter(int8_draft(target), codec)
    for i, prompt in enumerate(PROMPTS[:2]):
        ids = _ids(q4, prompt)
        out, spec = asyncio.run(_speculate(drafter, q4, ids, f"t:{i}"))
        again, _ = asyncio.run(_speculate(drafter, q4, ids, f"t:{i}"))
        assert out == again and spec.accepted > 0 and not spec.degraded
        own = asyncio.run(_tokens(q4, ids))
        # every token is llama.cpp's choice over batched rows: the first ones agree with its
        # one-row-at-a-time greedy output; where they part is what the benchmark reports
        at = _first_difference(out, own)
        assert at is None or at >= 3, (prompt, at)
        assert f"verify:t:{i}" not in q4.sessions  # released


def test_the_cli_shows_the_card_per_runtime() -> None:
    import json

    from typer.testing import CliRunner

    from tierlink.cli.main import app

    runner = CliRunner()
    shown = runner.invoke(app, ["llm", "card", "smollm2-135m", "--runtime", "llama.cpp",
                                "--json"])
    assert shown.exit_code == 0, shown.output
    card = json.loads(shown.stdout)
    assert card["format"] == "gguf" and card["language"]["measured"]["runtime"] == "llama.cpp"
    listed = json.loads(runner.invoke(app, ["llm", "list", "--json"]).stdout)
    assert {(r["name"], r["runtime"]) for r in listed} >= {("smollm2-135m", "torch"),
                                                          ("smollm2-135m", "llama.cpp")}
    refused = runner.invoke(app, ["llm", "card", "smollm2-135m", "--runtime", "llamacpp"])
    assert refused.exit_code == 2 and "llama.cpp" in refused.output


def test_answers_drafting_in_turn_keep_their_own_sequences(q4: LlamaCppModel) -> None:
    from tierlink.llm.sampling import generator

    draft = q4.draft_model()
    a_ids, b_ids = _ids(q4, PROMPTS[0]), _ids(q4, PROMPTS[1])
    alone = [p.token for p in draft.propose(draft.new_cache(), a_ids, 6, GREEDY,
                                            generator(0))]
    a, b = draft.new_cache(), draft.new_cache()
    first = [p.token for p in draft.propose(a, a_ids, 3, GREEDY, generator(0))]
    draft.propose(b, b_ids, 3, GREEDY, generator(0))  # b takes the context; a is parked
    after = [p.token for p in draft.propose(a, [*a_ids, *first], 3, GREEDY, generator(0))]
    assert first + after == alone  # a's second round went on from its restored sequence
    assert a in draft.answers and b in draft.answers
