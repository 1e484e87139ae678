"""Estimates of a chat answer's first token, speed and cost, by the way it is answered."""

from __future__ import annotations

from dataclasses import replace

from tierlink.core.types import LanguageModelView
from tierlink.estimate import chat

DRAFT = LanguageModelView("d", decode_tok_s=45.0, prefill_tok_s=400.0, acceptance=0.7)
LARGE = LanguageModelView("l", decode_tok_s=12.0, prefill_tok_s=150.0, price_per_1k=0.002)


def test_local_time_grows_with_the_prompt_and_the_queue() -> None:
    short, long = chat.local(LARGE, 10, 64), chat.local(LARGE, 500, 64)
    assert long.ttft_ms > short.ttft_ms + 3000  # 490 more tokens at 150 tok/s
    full = replace(LARGE, running=16, queued=8)
    assert chat.local(full, 10, 64).ttft_ms > 10 * short.ttft_ms
    assert chat.local(full, 10, 64).tokens_per_s < short.tokens_per_s / 2


def test_remote_adds_a_round_trip_before_the_first_token_only() -> None:
    here, there = chat.local(LARGE, 40, 64), chat.remote(LARGE, 40, 64, rtt_ms=50.0)
    assert there.ttft_ms == here.ttft_ms + 50.0 and there.tokens_per_s == here.tokens_per_s


def test_speculation_costs_the_verifier_less_per_token_the_better_the_draft() -> None:
    remote = chat.remote(LARGE, 40, 64, 20.0)
    good = chat.speculative(DRAFT, LARGE, 40, 64, 20.0)
    poor = chat.speculative(replace(DRAFT, acceptance=0.2), LARGE, 40, 64, 20.0)
    assert good.cost_per_1k < 0.7 * remote.cost_per_1k
    assert good.cost_per_1k < poor.cost_per_1k
    assert good.tokens_per_s > poor.tokens_per_s
    # a slow link costs speculation every round, a relay only its first token
    far = chat.speculative(DRAFT, LARGE, 40, 64, 300.0)
    assert far.tokens_per_s < chat.remote(LARGE, 40, 64, 300.0).tokens_per_s


def test_a_prompt_without_a_tokenizer_is_guessed_from_its_characters() -> None:
    from tierlink.chat.openai import parse_chat
    from tierlink.chat.placing import guess_tokens

    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x" * 400}]})
    assert 100 <= guess_tokens(req) <= 110
