"""An OpenAI chat-completions stream read as its server-sent events arrive: the answer's
text, when its first and last pieces came, the usage and tierlink's record of the answer.
The reading is the same whether the lines come from a blocking or an awaited response::

    stream = ChatStream()
    async for line in response.aiter_lines():
        stream.feed(line)
    stream.text, stream.ttft_s, stream.usage, stream.tierlink
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChatStream:
    clock: Callable[[], float] = time.perf_counter
    pieces: list[str] = field(default_factory=list)
    first: float | None = None  # when the first piece of text came (clock time)
    last: float | None = None  # and the last
    usage: dict[str, Any] = field(default_factory=dict)
    tierlink: dict[str, Any] = field(default_factory=dict)
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def feed(self, line: str) -> None:
        """One line of the stream (anything but a ``data:`` event is skipped)."""
        if not line.startswith("data: ") or line == "data: [DONE]":
            return
        data = json.loads(line[6:])
        for choice in data.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                self.last = self.clock()
                self.first = self.last if self.first is None else self.first
                self.pieces.append(piece)
        self.usage = data.get("usage") or self.usage
        self.tierlink = data.get("tierlink") or self.tierlink

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def ttft_s(self) -> float | None:
        """From the stream's start to its first piece of text (None: none came)."""
        return None if self.first is None else self.first - self.started

    @property
    def stream_s(self) -> float:
        """From the first piece of text to the last."""
        return 0.0 if self.first is None or self.last is None else self.last - self.first

    @property
    def completion_tokens(self) -> int:
        return int(self.usage.get("completion_tokens", 0))
