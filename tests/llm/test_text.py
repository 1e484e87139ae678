"""Chat templates, message checks and streaming detokenization with stop sequences."""

from __future__ import annotations

import pytest

from tierlink.errors import InvalidRequest
from tierlink.llm.text import Detokenizer, TextCodec, check_messages


def test_the_models_chat_template(codec: TextCodec) -> None:
    prompt = codec.chat_prompt([{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.startswith("<|im_start|>system\n")  # the template's default system turn


@pytest.mark.parametrize("messages", [[], [{"role": "wizard", "content": "x"}],
                                      [{"role": "user", "content": 3}],
                                      [{"role": "user", "content": "   "}],
                                      [{"role": "user", "content": [{"type": "image_url"}]}]])
def test_bad_messages_are_refused(messages: list) -> None:
    with pytest.raises(InvalidRequest):
        check_messages(messages)


def test_text_parts_are_joined() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]}]
    check_messages(messages)
    assert messages[0]["content"] == "ab"


def test_detokenizer_streams_and_holds_back_a_possible_stop(codec: TextCodec) -> None:
    ids = codec.encode("Hello world, this is the end. More text")
    detok = Detokenizer(codec, stop=("the end",))
    out = ""
    for t in ids:
        out += detok.push([t])
        if detok.stopped:
            break
    assert detok.stopped and out == "Hello world, this is "


def test_detokenizer_without_stops_returns_everything(codec: TextCodec) -> None:
    text = "Plain text, ünïcödé and emoji 🙂."
    detok = Detokenizer(codec)
    out = "".join(detok.push([t]) for t in codec.encode(text)) + detok.flush()
    assert out == text
