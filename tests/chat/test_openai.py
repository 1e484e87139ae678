"""Parsing OpenAI requests and writing OpenAI errors (no network)."""

from __future__ import annotations

import pytest

from tierlink.chat.openai import error_body, parse_chat, parse_completion
from tierlink.core.types import Privacy
from tierlink.errors import ContextTooLong, InvalidRequest, ModelNotFound

MSG = [{"role": "user", "content": "hi"}]


def test_a_chat_request_with_tierlink_parameters() -> None:
    req = parse_chat({"model": "chat", "messages": MSG, "max_tokens": 12, "temperature": 0,
                      "stop": "x", "seed": 3, "stream": True,
                      "stream_options": {"include_usage": True},
                      "tierlink": {"privacy": "local", "deadline_ms": 500, "session": "s",
                                   "draft_ahead": False}})
    assert req.params.max_tokens == 12 and req.params.greedy and req.params.stop == ("x",)
    assert req.stream and req.include_usage
    assert req.tierlink.privacy is Privacy.LOCAL and req.tierlink.session == "s"
    assert req.tierlink.draft_ahead is False
    assert parse_chat({"model": "m", "messages": MSG}).tierlink.draft_ahead is None


def test_max_completion_tokens_is_read() -> None:
    assert parse_chat({"model": "m", "messages": MSG,
                       "max_completion_tokens": 7}).params.max_tokens == 7


@pytest.mark.parametrize("body", [
    {"messages": MSG},
    {"model": "m", "messages": []},
    {"model": "m", "messages": "hi"},
    {"model": "m", "messages": MSG, "max_tokens": 0},
    {"model": "m", "messages": MSG, "max_tokens": 10 ** 6},
    {"model": "m", "messages": MSG, "n": 2},
    {"model": "m", "messages": MSG, "temperature": "hot"},
    {"model": "m", "messages": MSG, "tools": [{"type": "function"}]},
    {"model": "m", "messages": MSG, "tierlink": {"privacy": "secret"}},
    {"model": "m", "messages": MSG, "tierlink": {"deadline_ms": -1}},
    {"model": "m", "messages": MSG, "tierlink": {"draft_ahead": "yes"}},
    {"model": "m", "messages": MSG, "stream": "yes"},
    [1, 2],
])
def test_bad_requests_are_refused(body: object) -> None:
    with pytest.raises(InvalidRequest):
        parse_chat(body)


def test_a_completion_takes_one_prompt() -> None:
    assert parse_completion({"model": "m", "prompt": ["once"]}).prompt == "once"
    with pytest.raises(InvalidRequest):
        parse_completion({"model": "m", "prompt": ["a", "b"]})
    with pytest.raises(InvalidRequest):
        parse_completion({"model": "m", "prompt": ""})


def test_errors_in_openai_shape() -> None:
    body = error_body(InvalidRequest("max_tokens must be ...", param="max_tokens"))
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == "max_tokens"
    assert "Open Inference" not in body["error"]["message"]
    assert error_body(ModelNotFound("no such model"))["error"]["code"] == "model_not_found"
    assert error_body(ContextTooLong("too long"))["error"]["code"] == "context_length_exceeded"
