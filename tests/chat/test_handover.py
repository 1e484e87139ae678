"""When a conversation's cache follows its next turn: the same model file, privacy that
lets it go, and (``kv_move: auto``) a link that makes moving faster than prefilling."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from tierlink.chat.handover import Destination, move, worth_moving
from tierlink.core.types import LanguageModelView, LinkView, Privacy, Tier
from tierlink.llm.kvcache import KVCache
from tierlink.llm.sessions import Session, SessionStore
from tierlink.llm.source import LMSource
from tierlink.llm.weights import LlamaConfig

CFG = LlamaConfig(vocab_size=32, hidden_size=576, intermediate_size=32, num_layers=30,
                  num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                  rope_theta=1e4, context_length=8192, bos_token_id=1, eos_token_ids=(2,))
SAME = "weights:fp32:exact"


@dataclass
class _LM:
    """What the handover reads of a LanguageModel."""

    source: LMSource
    identity: str = SAME
    config: LlamaConfig = CFG
    sessions: SessionStore = field(default_factory=lambda: SessionStore(CFG))

    def held(self, key: str) -> Session | None:
        return self.sessions.get(key)

    def hold(self, key: str, tokens: int, privacy: Privacy = Privacy.ANY) -> None:
        cache = KVCache(CFG, initial=1)
        cache.length = cache.seen = tokens
        self.sessions.put(key, Session(cache, list(range(tokens)), privacy=privacy,
                                       origin="dev-1"))


def _to(mbit: float, identity: str = SAME, tier: Tier = Tier.CLOUD) -> Destination:
    return Destination("cloud-1", tier, LanguageModelView("smollm2", prefill_tok_s=300.0,
                                                           identity=identity),
                       "http://127.0.0.1:9", LinkView("dev-1", "cloud-1", 20.0, mbit))


def test_moving_is_worth_it_on_a_fast_link_only() -> None:
    lm = _LM(LMSource("smollm2", "smollm2-135m", kv_codec="int8"))
    # 1,000 tokens of int8 cache: ~12 MB; prefilling them there ~3.3 s
    assert worth_moving(lm, 1000, 1000, _to(100.0))  # ~1 s on the wire
    assert not worth_moving(lm, 1000, 1000, _to(10.0))  # ~10 s
    assert not worth_moving(lm, 1000, 1000, Destination(
        "cloud-1", Tier.CLOUD, LanguageModelView("smollm2"), "http://x", None))  # unknown link


@pytest.mark.parametrize(("source", "to", "privacy", "reason"), [
    (LMSource("m", "p", kv_move="never"), _to(1000.0), Privacy.ANY, "never"),
    (LMSource("m", "p"), _to(1000.0, identity="other:fp32:exact"), Privacy.ANY,
     "same model file"),
    (LMSource("m", "p", kv_move="always"), _to(1000.0), Privacy.SITE, "site"),
    (LMSource("m", "p", kv_move="always"), _to(1000.0, tier=Tier.EDGE), Privacy.LOCAL,
     "local"),
    (LMSource("m", "p"), _to(1.0), Privacy.ANY, "faster"),
])
def test_what_stays(source: LMSource, to: Destination, privacy: Privacy,
                    reason: str) -> None:
    lm = _LM(source)
    lm.hold("s", 1000, privacy)
    outcome = asyncio.run(move(None, lm, "s", to, 5.0))  # type: ignore[arg-type]
    assert outcome["moved"] is False and reason in outcome["reason"]
    assert lm.sessions.get("s") is not None and not lm.sessions.get("s").busy  # untouched


def test_a_destination_travels_to_the_holder_and_back() -> None:
    to = _to(50.0)
    links = [LinkView("edge-1", "cloud-1", 8.0, 200.0)]  # the holder's own estimate
    back = Destination.from_dict(to.to_dict(), links, lambda node: f"{node}.tierlink")
    assert (back.node_id, back.tier, back.url, back.model) == (to.node_id, to.tier, to.url,
                                                              to.model)
    assert back.link == links[0] and back.server_hostname == "cloud-1.tierlink"
    from tierlink.errors import InvalidRequest

    for bad in (None, {"node_id": "x"}, {**to.to_dict(), "url": "file:///etc/passwd"},
                {**to.to_dict(), "tier": "moon"}):
        with pytest.raises(InvalidRequest):
            Destination.from_dict(bad, links, lambda node: None)
