"""The llama.cpp runtime's engine and conversations, around a stand-in context (the real
one is tested in test_llamacpp.py): jobs one at a time in order, counted; a conversation
parked when another takes the context and restored for its next turn; the byte and count
caps; a keyless request never overwrites a kept conversation."""

from __future__ import annotations

import threading

from tierlink.llm.llama_engine import LlamaEngine, LlamaSessions, common_prefix


class Context:
    """What LlamaSessions uses of a context: its tokens, cut back, saved and loaded."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.loads = 0

    def keep(self, n: int) -> None:
        del self.tokens[n:]

    def save(self) -> bytes:
        return bytes(len(self.tokens) * [7])  # one byte a token

    def load(self, state: bytes, tokens: list[int]) -> None:
        assert len(state) == len(tokens)
        self.tokens = list(tokens)
        self.loads += 1


def _turn(sessions: LlamaSessions, ctx: Context, key: str | None, prompt: list[int],
          answer: list[int]) -> list[int]:
    feed = sessions.enter(key, prompt)
    ctx.tokens.extend(feed)
    ctx.tokens.extend(answer[:-1])  # the last answer token is not fed
    sessions.leave(key)
    return feed


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2, 3]) == 2


def test_a_conversation_continues_from_the_context_or_its_saved_state() -> None:
    ctx = Context()
    sessions = LlamaSessions(ctx)  # type: ignore[arg-type]
    a1 = [1, 2, 3, 4]
    assert _turn(sessions, ctx, "a", a1, [5, 6]) == a1
    # a's next turn: history + answer + new words; only what the context lacks is fed
    assert _turn(sessions, ctx, "a", [*a1, 5, 6, 8, 9], [10]) == [6, 8, 9]
    # b takes the context: a is parked (saved), b prefills from the shared prefix
    assert _turn(sessions, ctx, "b", [1, 2, 30], [31]) == [30]
    assert "a" in sessions and "b" in sessions and len(sessions) == 2
    # a again: its saved state is loaded, not prefilled again
    feed = _turn(sessions, ctx, "a", [1, 2, 3, 4, 5, 6, 8, 9, 10, 11], [12])
    assert feed == [10, 11] and ctx.loads == 1
    assert sessions.bytes_in_use() == 3  # b's state, parked in turn


def test_at_least_one_token_is_fed_and_a_keyless_request_keeps_nothing() -> None:
    ctx = Context()
    sessions = LlamaSessions(ctx)  # type: ignore[arg-type]
    _turn(sessions, ctx, "a", [1, 2, 3], [4])
    assert _turn(sessions, ctx, "a", [1, 2, 3], [4]) == [3]  # the same prompt: its last token
    _turn(sessions, ctx, None, [1, 2, 9], [10])  # reuses the prefix; a is parked first
    assert sessions.live is None and "a" in sessions
    assert _turn(sessions, ctx, "a", [1, 2, 3, 4], [5]) == [4]  # a's state, restored


def test_caps_drop_the_least_recently_parked() -> None:
    ctx = Context()
    sessions = LlamaSessions(ctx, max_sessions=2, max_bytes=10)  # type: ignore[arg-type]
    for key in ("a", "b", "c", "d"):
        _turn(sessions, ctx, key, [ord(key), 1, 2, 3], [4])
    assert "a" not in sessions  # two parked at most (b, c) beside the live one (d)
    assert "b" in sessions and "c" in sessions and sessions.live == "d"
    _turn(sessions, ctx, "big", list(range(100, 120)), [1])
    _turn(sessions, ctx, "e", [5], [6])  # big's 20-byte state is over the byte cap
    assert "big" not in sessions and sessions.bytes_in_use() <= 10
    assert sessions.drop("e") and not sessions.drop("e")


def test_the_engine_runs_jobs_one_at_a_time_in_order_and_counts_passes() -> None:
    engine = LlamaEngine()
    seen: list[int] = []
    passes: list[int] = []
    engine.on_pass = lambda rows, _s: passes.append(rows)
    done = threading.Event()
    engine.start()
    try:
        for i in range(5):
            engine.submit(lambda i=i: seen.append(engine.timed(i + 1, lambda: i)))
        engine.submit(lambda: 1 / 0)  # an escaped failure is logged; the engine goes on
        engine.submit(done.set)
        assert done.wait(10)
    finally:
        engine.stop()
    assert seen == [0, 1, 2, 3, 4] and passes == [1, 2, 3, 4, 5]
    assert engine.stats.passes == 5 and engine.stats.rows == 15
    assert engine.stats.queued == 0 and engine.stats.running == 0
