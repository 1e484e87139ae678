"""What a generation reports as it goes: its pieces, usage and timings (torch-free: a node
that relays chat to another reads them too)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Timing:
    submitted: float
    first_token: float | None = None
    finished: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated: int = 0


@dataclass
class Chunk:
    text: str
    tokens: list[int]
    finish_reason: str | None = None


@dataclass
class Generation:
    """What a finished (or running) generation reports: usage and timings."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    timing: Timing | None = None
    finish_reason: str | None = None
    text: list[str] = field(default_factory=list)
