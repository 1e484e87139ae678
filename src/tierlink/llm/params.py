"""A request's sampling parameters, checked on arrival (torch-free: every node parses chat
requests, with or without a language model of its own)."""

from __future__ import annotations

from dataclasses import dataclass

from tierlink.errors import InvalidRequest

MAX_TOKENS_LIMIT = 8192


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit (drafts use a limit so their proposal travels sparse)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # generate max_tokens whatever the model says (vLLM's option)

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            raise InvalidRequest(f"max_tokens must be between 1 and {MAX_TOKENS_LIMIT}, "
                                 f"got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequest(f"temperature must be between 0 and 2, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if len(self.stop) > 4 or any(not s for s in self.stop):
            raise InvalidRequest("stop: at most 4 non-empty sequences")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
