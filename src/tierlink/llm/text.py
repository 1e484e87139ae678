"""Text in and out of a language model: tokens, chat templates, streaming detokenization,
stop sequences.

The tokenizer is the model directory's ``tokenizer.json`` (the ``tokenizers`` library, no
transformers at run time); the chat template is its ``chat_template.jinja`` rendered in a
sandbox, as transformers renders it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierlink.errors import InvalidRequest, ModelError

ROLES = ("system", "user", "assistant", "tool", "developer")


class TextCodec:
    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise ModelError(f"cannot read {directory / 'tokenizer.json'}: {exc}") from exc
        config = _read_json(directory / "tokenizer_config.json")
        self.eos_text = config.get("eos_token") or "</s>"
        self.bos_text = config.get("bos_token") or ""
        template = directory / "chat_template.jinja"
        self.template_text = template.read_text() if template.is_file() else None
        self._template: Any = None
        self.eos_ids = frozenset(i for i in (self.tokenizer.token_to_id(self.eos_text),
                                             self.tokenizer.token_to_id("<|endoftext|>"))
                                 if i is not None)

    @property
    def name(self) -> str:
        return "byte-level BPE" if "ByteLevel" in self.tokenizer.to_str()[:4000] else "tokenizers"

    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """The model's own template with ``add_generation_prompt``; messages are checked."""
        check_messages(messages)
        if self.template_text is None:
            raise InvalidRequest("this model has no chat template",
                                 hint="use /v1/completions with a plain prompt")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._template = env.from_string(self.template_text)
        return str(self._template.render(messages=messages, add_generation_prompt=True,
                                         bos_token=self.bos_text, eos_token=self.eos_text))


def check_messages(messages: list[dict[str, Any]]) -> None:
    if not messages:
        raise InvalidRequest("messages is empty", hint="send at least one message")
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: text only
            texts = [p.get("text") for p in content if isinstance(p, dict)]
            if any(not isinstance(t, str) for t in texts) or len(texts) != len(content):
                raise InvalidRequest(f"messages[{i}].content: only text parts are supported")
            m["content"] = "".join(texts)  # type: ignore[arg-type]
        elif not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string")
    if not any(str(m["content"]).strip() for m in messages):
        raise InvalidRequest("every message is empty", hint="say something")


@dataclass
class Detokenizer:
    """Turns a growing list of token ids into text deltas, holding back what may still be a
    stop sequence or an incomplete UTF-8 character, and says when a stop sequence ended it."""

    codec: TextCodec
    stop: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    emitted: str = ""
    stopped: bool = False

    def push(self, tokens: list[int]) -> str:
        self.ids.extend(tokens)
        text = self.codec.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character still incomplete
            return ""
        for s in self.stop:
            at = text.find(s, max(0, len(self.emitted) - len(s)))
            if at >= 0:
                self.stopped = True
                return self._emit(text[:at])
        safe = len(text)
        for s in self.stop:  # hold back what may be the start of a stop sequence
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    safe = min(safe, len(text) - n)
                    break
        return self._emit(text[:max(safe, len(self.emitted))])

    def flush(self) -> str:
        if self.stopped:
            return ""
        return self._emit(self.codec.decode(self.ids))

    def _emit(self, text: str) -> str:
        if not text.startswith(self.emitted):  # decoding changed an earlier piece: resync
            self.emitted = text
            return ""
        delta = text[len(self.emitted):]
        self.emitted = text
        return delta


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}
