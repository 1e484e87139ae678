"""How a node places a chat request on arrival (``ChatService.prepare``): its own model and
its upstreams' as they list them, privacy first, then the difficulty router and the policy."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from tierlink.chat.openai import parse_chat
from tierlink.chat.placing import NodeLink
from tierlink.chat.router import DifficultyRouter
from tierlink.chat.service import ChatService, Prepared, VerifierLink
from tierlink.core.types import LanguageModelView, LinkView, NodeView, Tier
from tierlink.errors import InvalidRequest, ModelNotFound, NoFeasiblePlacement, PrivacyViolation
from tierlink.models.card import LanguageInfo, ModelCard

MSG = [{"role": "user", "content": "hi"}]
LARGE = LanguageModelView("smollm2", ("chat",), quality=0.76, prefill_tok_s=150.0,
                          decode_tok_s=12.0, price_per_1k=0.002)


@dataclass
class _Source:
    quality: float | None = 0.56
    verifier: str | None = "cloud-1/smollm2"
    router: str | None = None
    max_sequences: int = 16
    k_max: int = 4
    draft_ahead: bool = True


@dataclass
class _Stats:
    running: int = 0
    queued: int = 0


@dataclass
class _Engine:
    stats: _Stats = field(default_factory=_Stats)


class _Model:
    """Just what ChatService reads of a LanguageModel when it places a request."""

    context_length = 8192
    identity = "weights:fp32:exact"

    def __init__(self, score: float | None = None) -> None:
        self.name = "smollm2"
        self.source = _Source()
        self.card = ModelCard("smollm2", "chat", "1", format="llm", language=LanguageInfo(
            "llama", self.context_length, 2, 8, 64, prefill_tokens_per_s=400.0,
            decode_tokens_per_s=45.0, tokenizer={}, source={}, measured={}))
        self.engine = _Engine()
        self.model = self.codec = None
        self._feature = None if score is None else np.log(score / (1 - score))

    def chat_ids(self, _messages: list[dict[str, Any]]) -> list[int]:
        return [1, 2, 3]

    def draft_model(self) -> None:
        return None

    def check_length(self, _ids: list[int], _params: object) -> None:
        return None

    async def prompt_features(self, _ids: list[int]) -> np.ndarray:
        return np.asarray([self._feature])


class _Peers:
    def __init__(self, nodes: list[NodeView]) -> None:
        self.nodes = nodes

    async def current(self) -> list[NodeView]:
        return self.nodes

    def views(self) -> list[NodeView]:
        return self.nodes


def _service(lm: _Model | None, *, router_score: bool = False,
             cloud_healthy: bool = True, cloud_models: tuple[LanguageModelView, ...] = (LARGE,)
             ) -> ChatService:
    models: dict[str, Any] = {} if lm is None else {"smollm2": lm}
    service = ChatService(
        "dev-1", Tier.DEVICE, models, {"chat": "smollm2"} if lm else {},
        verifiers={"smollm2": VerifierLink("cloud-1", "http://x", "smollm2", Tier.CLOUD)}
        if lm else {}, upstreams={"cloud-1": "http://x"},
        node=NodeLink(links=lambda: [LinkView("dev-1", "cloud-1", 20.0, 50.0)],
                      healthy=lambda node: cloud_healthy or node != "cloud-1"))
    service.placer.peers = _Peers([NodeView("cloud-1", Tier.CLOUD, (),  # type: ignore[assignment]
                                            language_models=cloud_models)])
    if router_score and lm is not None:  # score = sigmoid(feature), threshold 0.5
        service.routers = {"smollm2": DifficultyRouter(np.zeros(1), np.ones(1), np.ones(1),
                                                       0.0, 0.5)}
    return service


def _prepare(service: ChatService, **tierlink: Any) -> Prepared:
    req = parse_chat({"model": "chat", "messages": MSG, "tierlink": tierlink})
    return asyncio.run(service.prepare(req))


def _first(prep: Prepared) -> str:
    return prep.plan.options[0].kind


def test_prompts_that_may_leave_go_to_the_better_model_cheaply() -> None:
    assert _first(_prepare(_service(_Model()))) == "speculative"
    assert _first(_prepare(_service(_Model()), privacy="local")) == "local"
    assert _first(_prepare(_service(_Model()), privacy="site")) == "local"  # cloud verifier


def test_the_router_keeps_easy_prompts_local() -> None:
    easy = _prepare(_service(_Model(0.2), router_score=True))
    assert _first(easy) == "local" and easy.meta["difficulty"] == 0.2
    assert _first(_prepare(_service(_Model(0.8), router_score=True))) == "speculative"
    forced = _prepare(_service(_Model(0.2), router_score=True), mode="speculative")
    assert [o.kind for o in forced.plan.options] == ["speculative"]  # asked explicitly
    kept = _prepare(_service(_Model(0.8), router_score=True), mode="local")
    assert [o.kind for o in kept.plan.options] == ["local"]


def test_a_down_verifier_leaves_the_device_its_own_model() -> None:
    prep = _prepare(_service(_Model(), cloud_healthy=False))
    assert [o.kind for o in prep.plan.options] == ["local"]


def test_a_node_without_a_model_relays() -> None:
    prep = _prepare(_service(None))
    assert [(o.kind, o.node_id) for o in prep.plan.options] == [("remote", "cloud-1")]
    assert prep.lm is None and prep.ids is None


@pytest.mark.parametrize(("lm", "tierlink", "error"), [
    (_Model(), {"privacy": "local", "mode": "speculative"}, InvalidRequest),
    (_Model(), {"mode": "warp"}, InvalidRequest),
    (None, {"mode": "local"}, ModelNotFound),
    (None, {"privacy": "local", "origin": "dev-2"}, PrivacyViolation),
    (_Model(), {"ttft_ms": 1}, NoFeasiblePlacement),
])
def test_refusals_on_arrival(lm: _Model | None, tierlink: dict[str, Any],
                             error: type[Exception]) -> None:
    with pytest.raises(error):
        _prepare(_service(lm), **tierlink)


def test_an_unknown_model_is_404_even_where_nothing_is_served() -> None:
    with pytest.raises(ModelNotFound):
        _prepare(_service(None, cloud_models=()))
