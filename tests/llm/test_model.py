"""The decoder on the real SmolLM2: same logits as transformers' Llama, and a position's
logits bit-identical however its row was batched — the property speculative decoding's
"identical greedy output" rests on."""

from __future__ import annotations

import torch

from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import LlamaModel, Step

IDS = [1, 504, 3458, 282, 4649, 314, 253, 2177, 28, 1041, 17, 980]


def test_logits_match_transformers(target: LlamaModel, lm_dir) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(lm_dir), dtype=torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    ours = target.forward([Step(KVCache(target.config), IDS, all_logits=True, block=True)])[0]
    assert (ours - ref).abs().max().item() < 1e-3
    assert ours.argmax(-1).tolist() == ref.argmax(-1).tolist()


def _decoded(model: LlamaModel, prefix: list[int], rest: list[int]) -> list[torch.Tensor]:
    cache = KVCache(model.config)
    model.forward([Step(cache, prefix, block=True)])
    return [model.forward([Step(cache, [t])])[0][0] for t in rest]


def test_verified_rows_equal_decoded_rows_bitwise(target: LlamaModel) -> None:
    decoded = _decoded(target, IDS[:5], IDS[5:])
    cache = KVCache(target.config)
    target.forward([Step(cache, IDS[:5], block=True)])
    verified = target.forward([Step(cache, IDS[5:], all_logits=True)])[0]
    assert all(torch.equal(a, b) for a, b in zip(decoded, verified, strict=True))


def test_rows_do_not_depend_on_their_batch(target: LlamaModel) -> None:
    alone = _decoded(target, IDS[:5], IDS[5:])
    mine, other = KVCache(target.config), KVCache(target.config)
    target.forward([Step(mine, IDS[:5], block=True)])
    target.forward([Step(other, [1, 33, 44, 55, 66, 77, 88], block=True)])
    batched = []
    for i, t in enumerate(IDS[5:]):
        drafts = [100 + i, 101 + i, 102 + i]
        out = target.forward([Step(other, drafts, all_logits=True), Step(mine, [t])])
        other.crop(other.length - 2)  # keep the neighbour growing slowly, unlike `mine`
        batched.append(out[1][0])
    assert all(torch.equal(a, b) for a, b in zip(alone, batched, strict=True))


def test_cropping_the_cache_forgets_rejected_rows(target: LlamaModel) -> None:
    cache = KVCache(target.config)
    target.forward([Step(cache, IDS[:6], block=True)])
    target.forward([Step(cache, [999, 998, 997], all_logits=True)])
    cache.crop(6)
    again = target.forward([Step(cache, [IDS[6]])])[0][0]
    assert torch.equal(again, _decoded(target, IDS[:6], [IDS[6]])[0])


def test_card_figures(target: LlamaModel) -> None:
    assert 130e6 < target.parameters() < 140e6
    assert target.config.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
