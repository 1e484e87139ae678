"""Copies of conversations kept where their turns enter: a chain that grows by deltas, the
least recently refreshed dropped past the budget, and shipped only where it may and should
go."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from tierlink.chat.copies import Copy, KeptCopies
from tierlink.chat.handover import Destination
from tierlink.core.types import LanguageModelView, LinkView, Privacy, Tier
from tierlink.errors import SessionBusy, UpstreamUnavailable
from tierlink.llm.kvcache import KVCache
from tierlink.llm.kvship import Holder, pack, unpack
from tierlink.llm.weights import LlamaConfig

CFG = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=32, num_layers=2,
                  num_heads=2, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5,
                  rope_theta=1e4, context_length=512, bos_token_id=1, eos_token_ids=(2,))
MODEL = "weights:fp32:exact"


def _cache(n: int) -> KVCache:
    torch.manual_seed(0)
    cache = KVCache(CFG)
    cache.make_room(40, lambda k, _by: k)
    for layer in range(CFG.num_layers):
        cache.write(layer, 0, torch.randn(2, 40, 32), torch.randn(2, 40, 32))
    cache.advance(n)
    return cache


def _package(n: int, start: int = 0, privacy: Privacy = Privacy.ANY) -> bytes:
    return pack(_cache(n), Holder(tuple(range(n)), privacy, "dev-1"), MODEL, "fp32",
                start=start)


def test_a_copy_grows_by_deltas_and_starts_again_from_a_whole_package() -> None:
    copy = Copy("cloud-1", "smollm2")
    copy.add(_package(10))
    copy.add(_package(16, start=10))
    copy.add(_package(20, start=16))
    assert len(copy.packages) == 3 and copy.header["length"] == 20
    cache, holder = unpack(copy.chain(), CFG, MODEL)
    assert cache.length == 20 and holder.tokens == tuple(range(20))
    assert torch.equal(cache.k[1][:, :20], _cache(20).k[1][:, :20])
    with pytest.raises(ValueError, match="continue"):
        copy.add(_package(30, start=25))  # a gap: the copy stays as it was
    assert copy.header["length"] == 20
    copy.add(_package(8))  # the holder evicted: a whole package again
    assert len(copy.packages) == 1 and copy.header["length"] == 8


def _copies(answers: dict[str, list[Any]], max_bytes: int = 1 << 30) -> KeptCopies:
    """Copies whose holder answers each session's fetches in turn (a package or an error)."""
    kept = KeptCopies("dev-1", http=lambda: None, tls=lambda: None,  # type: ignore[arg-type]
                      upstreams=lambda: {"cloud-1": "http://127.0.0.1:9"},
                      max_bytes=max_bytes)

    async def fetch(session: str, copy: Copy) -> bytes:
        answer = answers[session].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    kept._fetch = fetch  # type: ignore[method-assign]
    return kept


def test_turns_refresh_the_copy_in_order_and_a_failed_refresh_keeps_it() -> None:
    async def main() -> None:
        kept = _copies({"s": [_package(10), _package(16, start=10),
                              UpstreamUnavailable("gone"), SessionBusy("busy"),
                              _package(20, start=16)]})
        kept.after_turn("s", "cloud-1", "smollm2")
        kept.after_turn("s", "cloud-1", "smollm2")  # waits for the first
        await kept.settled()
        copy = kept.get("s")
        assert copy is not None and copy.header["length"] == 16
        kept.after_turn("s", "cloud-1", "smollm2")  # the holder is away: kept as it was
        await kept.settled()
        assert kept.get("s") is copy and copy.header["length"] == 16
        kept.after_turn("s", "cloud-1", "smollm2")  # busy finishing its turn, then answers
        await kept.settled()
        assert copy.header["length"] == 20

    asyncio.run(main())


def test_past_the_budget_the_least_recently_refreshed_copy_goes() -> None:
    async def main() -> None:
        size = len(_package(10))
        kept = _copies({"a": [_package(10)], "b": [_package(10)], "c": [_package(10)]},
                       max_bytes=2 * size + 10)
        for session in "abc":
            kept.after_turn(session, "cloud-1", "smollm2")
            await kept.settled()
        assert kept.get("a") is None and kept.get("b") and kept.get("c")
        assert kept.nbytes <= kept.max_bytes

    asyncio.run(main())


def _to(identity: str = MODEL, tier: Tier = Tier.EDGE, mbit: float | None = None
        ) -> Destination:
    link = LinkView("dev-1", "edge-1", 20.0, mbit) if mbit is not None else None
    return Destination("edge-1", tier, LanguageModelView("smollm2", prefill_tok_s=300.0,
                                                          identity=identity),
                       "http://127.0.0.1:9", link)


@pytest.mark.parametrize(("to", "privacy", "reason"), [
    (_to(identity="other:fp32:exact"), Privacy.ANY, "same model file"),
    (_to(tier=Tier.CLOUD), Privacy.SITE, "stays off cloud"),
    (_to(mbit=0.001), Privacy.ANY, "prefilling"),  # a link too slow for the bytes
])
def test_a_copy_goes_only_where_it_may_and_should(to: Destination, privacy: Privacy,
                                                  reason: str) -> None:
    async def main() -> None:
        kept = _copies({"s": [_package(10, privacy=privacy)]})
        kept.after_turn("s", "cloud-1", "smollm2")
        await kept.settled()
        outcome = await kept.ship("s", to, 1.0)
        assert outcome is not None and outcome["moved"] is False
        assert reason in outcome["reason"] and outcome["copy"] is True
        assert await kept.ship("nobody", to, 1.0) is None

    asyncio.run(main())
