"""A language model split at a layer: the device's head and the upstream's tail give the
unsplit model's greedy output when the hidden states cross exactly; the upstream never reads
a token id; a quantized link is measured, not assumed."""

from __future__ import annotations

import copy

import pytest

from tierlink.llm.layer_split import first_divergence, greedy, split_greedy


@pytest.fixture(scope="module")
def prompt(codec) -> list[int]:
    return codec.encode(codec.chat_prompt([{"role": "user",
                                            "content": "Name three colours of the rainbow."}]))


@pytest.mark.parametrize("cut", [1, 15, 29])
def test_an_exact_split_gives_the_unsplit_greedy_output(target, prompt, cut) -> None:
    reference = greedy(target, prompt, 12)
    run = split_greedy(target, target, prompt, cut, "fp32", 12)
    assert run.tokens == reference
    assert len(run.payload_bytes) == len(run.tokens)  # the prompt's rows, then one per token
    assert run.payload_bytes[1] >= 576 * 4  # one position's hidden state, FP32
    assert run.payload_bytes[0] >= len(prompt) * 576 * 4


def test_the_upstream_never_reads_a_token_id(target, prompt) -> None:
    upstream = copy.copy(target)
    upstream.embed = None  # no embedding table upstream: the tail starts from hidden states
    assert split_greedy(target, upstream, prompt, 8, "fp16", 6).tokens == \
        split_greedy(target, target, prompt, 8, "fp16", 6).tokens


def test_a_quantized_link_sends_less_and_is_compared_token_by_token(target, prompt) -> None:
    exact = split_greedy(target, target, prompt, 8, "fp32", 8)
    int8 = split_greedy(target, target, prompt, 8, "int8", 8)
    assert int8.payload_bytes[1] < exact.payload_bytes[1] / 3
    d = first_divergence(exact.tokens, int8.tokens)
    assert d is None or 0 <= d < 8


def test_a_cut_outside_the_layers_is_refused(target, prompt) -> None:
    with pytest.raises(ValueError, match="1..29"):
        split_greedy(target, target, prompt, 30, "fp32", 1)
    with pytest.raises(ValueError, match="1..29"):
        split_greedy(target, target, prompt, 0, "fp32", 1)


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_a_node_s_tail_continues_a_device_s_head_as_the_engine_would(target, codec) -> None:
    """The two sides as nodes run them (``head_rows`` on the device, the upstream's
    ``split_tail`` keeping its cache between messages): the answer is the upstream model's
    own greedy answer (its engine, prompt chunks and decode rows), token for token."""
    import asyncio

    import torch

    from tierlink.errors import InvalidRequest
    from tierlink.llm.kvcache import KVCache
    from tierlink.llm.layer_split import head_rows
    from tierlink.llm.runtime import LanguageModel
    from tierlink.llm.sampling import SamplingParams
    from tierlink.llm.source import LMSource
    from tierlink.split.codecs import decode_any, get_codec

    lm = LanguageModel(LMSource("smollm2", "smollm2-135m"), target, codec, card={})
    greedy_params = SamplingParams(max_tokens=16, temperature=0.0)
    wire = get_codec("fp16")

    async def run(ids: list[int]) -> tuple[list[int], list[int]]:
        own = [t async for c in lm.generate(ids, greedy_params) for t in c.tokens]
        cache, rows, out = KVCache(target.config), ids, []
        while len(out) < greedy_params.max_tokens:
            hidden = torch.from_numpy(decode_any(wire.encode(
                head_rows(target, cache, rows, 8).numpy())))
            token = await lm.split_tail("dev-1:x", hidden, 8, greedy_params)
            if token in codec.eos_ids:
                break
            out.append(token)
            rows = [token]
        assert lm.release_tail("dev-1:x") and not lm.release_tail("dev-1:x")
        return own, out
    lm.start()
    try:
        for prompt in ("What is the capital of France?", "Write a haiku about the sea."):
            own, split = asyncio.run(run(codec.encode(codec.chat_prompt(
                [{"role": "user", "content": prompt}]))))
            assert split == own
        with pytest.raises(InvalidRequest):  # rows of another width
            asyncio.run(lm.split_tail("k", torch.zeros(2, 7), 8, greedy_params))
        with pytest.raises(InvalidRequest):  # a cut past the layers
            asyncio.run(lm.split_tail("k", torch.zeros(2, 576), 30, greedy_params))
    finally:
        lm.stop()
