"""How a chat request's mode is chosen: privacy first, then the difficulty router."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from tierlink.chat.openai import parse_chat
from tierlink.chat.router import DifficultyRouter
from tierlink.chat.service import ChatService, VerifierLink
from tierlink.core.types import Tier
from tierlink.errors import InvalidRequest

MSG = [{"role": "user", "content": "hi"}]


@dataclass
class _Source:
    k_max: int = 4


class _Model:
    """Just what ChatService.route reads of a LanguageModel."""

    def __init__(self, score: float | None, threshold: float = 0.5) -> None:
        self.name = "smollm2"
        self.source = _Source()
        self.model = None
        self.codec = None
        # a router whose score is the first feature, as a probability: features [logit]
        self.router = None if score is None else DifficultyRouter(
            np.zeros(1), np.ones(1), np.ones(1), 0.0, threshold)
        self._feature = None if score is None else np.log(score / (1 - score))

    async def prompt_features(self, _ids: list[int]) -> np.ndarray:
        return np.asarray([self._feature])


def _service(lm: Any, verifier_tier: Tier = Tier.CLOUD) -> ChatService:
    service = ChatService.__new__(ChatService)
    service.node_id, service.tier, service.metrics = "dev-1", Tier.DEVICE, None
    service.verifiers = {"smollm2": VerifierLink("cloud-1", "http://x", "smollm2",
                                                 verifier_tier)}
    service.routers = {} if lm.router is None else {"smollm2": lm.router}
    return service


def _route(lm: Any, **tierlink: Any) -> tuple[str, dict[str, Any]]:
    req = parse_chat({"model": "chat", "messages": MSG, "tierlink": tierlink})
    meta: dict[str, Any] = {}
    return asyncio.run(_service(lm).route(req, lm, [1, 2], meta)), meta


def test_without_a_router_prompts_that_may_leave_are_speculated() -> None:
    assert _route(_Model(None))[0] == "speculative"
    assert _route(_Model(None), privacy="local")[0] == "local"
    assert _route(_Model(None), privacy="site")[0] == "local"  # the verifier is a cloud


def test_the_router_keeps_easy_prompts_local() -> None:
    mode, meta = _route(_Model(0.2))
    assert mode == "local" and meta["difficulty"] == 0.2
    assert _route(_Model(0.8))[0] == "speculative"
    assert _route(_Model(0.2), mode="speculative")[0] == "speculative"  # asked explicitly
    assert _route(_Model(0.8), mode="local")[0] == "local"


def test_speculation_a_prompt_may_not_take_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        _route(_Model(None), privacy="local", mode="speculative")
