"""Reading an OpenAI chat stream: pieces of text with their times, usage, tierlink's
record; what is not a data event is skipped."""

from __future__ import annotations

import json
from collections.abc import Iterator

from tierlink.client.chat_stream import ChatStream


def _event(body: dict) -> str:
    return "data: " + json.dumps(body)


def test_a_stream_is_read_piece_by_piece() -> None:
    ticks: Iterator[float] = iter([10.0, 10.5, 11.0, 12.0])
    stream = ChatStream(clock=lambda: next(ticks))
    for line in [": keep-alive", "",
                 _event({"choices": [{"delta": {"role": "assistant"}}]}),
                 _event({"choices": [{"delta": {"content": "Hel"}}]}),
                 _event({"choices": [{"delta": {"content": "lo"}}]}),
                 _event({"choices": [{"delta": {"content": "!"}}]}),
                 _event({"choices": [], "usage": {"completion_tokens": 3},
                         "tierlink": {"served_by": "cloud-1"}}),
                 "data: [DONE]"]:
        stream.feed(line)
    assert stream.text == "Hello!" and stream.completion_tokens == 3
    assert stream.ttft_s == 0.5 and stream.stream_s == 1.5
    assert stream.tierlink == {"served_by": "cloud-1"}


def test_a_stream_without_text_has_no_first_token() -> None:
    stream = ChatStream()
    stream.feed(_event({"choices": [{"delta": {}, "finish_reason": "length"}]}))
    assert stream.text == "" and stream.ttft_s is None and stream.stream_s == 0.0
