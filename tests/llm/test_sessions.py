"""Sessions: prefix reuse, busy conversations, eviction and release."""

from __future__ import annotations

import pytest

from tierlink.errors import SessionBusy
from tierlink.llm.kvcache import KVCache
from tierlink.llm.sessions import SessionStore
from tierlink.llm.weights import LlamaConfig

CFG = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                  num_heads=2, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-5,
                  rope_theta=1e4, context_length=64, bos_token_id=1, eos_token_ids=(2,))


def _fed(cache: KVCache, n: int) -> None:
    cache.make_room(n, lambda k, _by: k)
    cache.advance(n)


def test_a_follow_up_feeds_only_what_is_new() -> None:
    store = SessionStore(CFG)
    s = store.open("c")
    _fed(s.cache, 5)
    s.tokens = [1, 2, 3, 4, 5]
    store.close("c", s)
    again = store.open("c")
    assert again.reuse([1, 2, 3, 4, 5, 6, 7]) == [6, 7]
    assert again.reuse([1, 2, 9]) == [9] and again.cache.length == 2  # diverged: cropped
    assert again.reuse([1, 2]) == [2]  # at least one token is fed


def test_a_busy_conversation_refuses_a_second_turn() -> None:
    store = SessionStore(CFG)
    store.open("c")
    with pytest.raises(SessionBusy):
        store.open("c")


def test_idle_sessions_are_evicted_and_released() -> None:
    store = SessionStore(CFG, max_sessions=2)
    for key in ("a", "b", "c"):
        store.close(key, store.open(key))
    assert len(store) == 2 and "a" not in store and store.evictions == 1
    assert store.drop("b") and "b" not in store
    busy = store.open("d")
    assert not store.drop("d")  # a turn in progress keeps its cache
    store.close("d", busy)
    assert store.recent(60.0) == 2
