"""A conversation moved between two runtimes of the same model file: its next turn equals
the unmoved one's (FP32 package), reuses the moved prefix, and keeps its privacy."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tierlink.core.types import Privacy
from tierlink.errors import PackageRefused, SessionBusy, SessionNotFound
from tierlink.llm.runtime import Generation, LanguageModel
from tierlink.llm.sampling import SamplingParams
from tierlink.llm.source import LMSource

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
FIRST = [{"role": "user", "content": "Name three rivers in Europe."}]


@pytest.fixture(scope="module")
def pair(target, codec) -> Iterator[tuple[LanguageModel, LanguageModel]]:
    runtimes = tuple(LanguageModel(LMSource("smollm2", "smollm2-135m"), target, codec, card={})
                     for _ in range(2))
    for lm in runtimes:
        lm.identity = "same-file:fp32:exact"
        lm.start()
    yield runtimes
    for lm in runtimes:
        lm.stop()


async def _turn(lm: LanguageModel, messages: list[dict[str, str]], session: str,
                report: Generation | None = None, privacy: Privacy = Privacy.ANY) -> str:
    ids = lm.chat_ids(messages)
    return "".join([c.text async for c in lm.generate(ids, GREEDY, session, report,
                                                      privacy=privacy, origin="dev-1")])


def _second(first_answer: str) -> list[dict[str, str]]:
    return [*FIRST, {"role": "assistant", "content": first_answer},
            {"role": "user", "content": "Which of them is the longest?"}]


def test_a_moved_conversation_answers_as_the_unmoved_one(pair) -> None:
    here, there = pair

    async def run() -> tuple[str, str, Generation, Generation]:
        answer = await _turn(here, FIRST, "s1", privacy=Privacy.SITE)
        blob, holder = await here.export("s1", "fp32")
        assert holder.privacy is Privacy.SITE and holder.origin == "dev-1"
        moved = await there.adopt("s1", blob)
        assert moved.tokens == holder.tokens
        stayed_report, moved_report = Generation(), Generation()
        stayed = await _turn(here, _second(answer), "s1", stayed_report)
        went = await _turn(there, _second(answer), "s1", moved_report)
        return stayed, went, stayed_report, moved_report
    stayed, went, stayed_report, moved_report = asyncio.run(run())
    assert went == stayed and went
    assert moved_report.cached_tokens == stayed_report.cached_tokens > 20
    assert there.sessions._sessions["s1"].privacy is Privacy.SITE  # kept, not relaxed


def test_a_quantized_move_reuses_the_prefix(pair) -> None:
    here, there = pair

    async def run() -> Generation:
        answer = await _turn(here, FIRST, "s2")
        blob, _ = await here.export("s2", "int8")
        await there.adopt("s2", blob)
        report = Generation()
        await _turn(there, _second(answer), "s2", report)
        return report
    report = asyncio.run(run())
    assert report.cached_tokens > 20 and report.completion_tokens > 0


def test_what_cannot_move(pair) -> None:
    here, there = pair
    with pytest.raises(SessionNotFound):
        asyncio.run(here.export("nobody", "fp16"))

    async def busy() -> None:
        await _turn(here, FIRST, "s3")
        blob, _ = await here.export("s3", "fp16")
        held = there.sessions.open("s3")  # a turn in progress there
        try:
            with pytest.raises(SessionBusy):
                await there.adopt("s3", blob)
        finally:
            there.sessions.close("s3", held)
        there.identity = "another-file:fp32:exact"
        try:
            with pytest.raises(PackageRefused):
                await there.adopt("s3", blob)
        finally:
            there.identity = here.identity
    asyncio.run(busy())


def test_a_copy_being_packed_leaves_the_conversation_free(pair) -> None:
    here, there = pair

    async def run() -> None:
        await _turn(here, FIRST, "copied")
        copying = asyncio.ensure_future(here.export("copied", "fp32", since=(0, 0)))
        await asyncio.sleep(0)  # the slots are taken; the packing runs in a thread
        assert not here.sessions.get("copied").busy  # its next turn would not wait
        blob, _ = await copying
        moving = asyncio.ensure_future(here.export("copied", "fp32"))
        await asyncio.sleep(0)
        assert here.sessions.get("copied").busy  # a conversation moving away is held
        await moving
        await there.adopt("copied", blob)
        assert there.sessions.get("copied").tokens == here.sessions.get("copied").tokens

    asyncio.run(run())
