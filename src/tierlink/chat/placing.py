"""A chat request's placement on a node: the cluster view it is decided over (the node's
registry view, its own language models as they are this instant, its upstreams' as they
list them, its link estimates and breakers) and the ask (``policy/chat.py``) built from
the request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from tierlink.chat.affinity import SessionAffinity
from tierlink.chat.openai import ChatRequest
from tierlink.chat.peers import PeerModels
from tierlink.core.types import ClusterView, LanguageModelView, LinkView, NodeView, Tier
from tierlink.estimate.chat import CHARS_PER_TOKEN
from tierlink.policy.base import Weights
from tierlink.policy.chat import ChatAsk, ChatPlan, plan_chat


@dataclass(frozen=True, slots=True)
class NodeLink:
    """What a chat service reads of the node it runs in (all optional in a bare test)."""

    view: Callable[[], ClusterView] | None = None  # the registry's view, as the node keeps it
    links: Callable[[], Iterable[LinkView]] = tuple  # this node's link estimates
    healthy: Callable[[str], bool] = lambda _node: True  # its circuit breakers
    url_of: Callable[[str], str | None] = lambda _node: None  # an upstream's base URL
    features_may_leave: bool = False  # routing.local_features_may_leave: a split may carry
    # a local prompt's hidden states upstream


class ChatPlacer:
    def __init__(self, node_id: str, tier: Tier, node: NodeLink, peers: PeerModels | None,
                 weights: Weights | None = None, max_hops: int = 3,
                 affinity: SessionAffinity | None = None) -> None:
        self.node_id = node_id
        self.tier = tier
        self.node = node
        self.peers = peers
        self.weights = weights or Weights()
        self.max_hops = max_hops
        self.affinity = affinity or SessionAffinity()

    async def view(self, mine: tuple[LanguageModelView, ...]) -> ClusterView:
        base = self.node.view() if self.node.view is not None else None
        nodes: dict[str, NodeView] = dict(base.nodes) if base is not None else {}
        links = {(l.src, l.dst): l for l in (base.links.values() if base else ())}
        me = nodes.get(self.node_id) or NodeView(self.node_id, self.tier, ())
        nodes[self.node_id] = replace(me, language_models=mine)
        for peer in (await self.peers.current() if self.peers is not None else ()):
            known = nodes.get(peer.node_id)
            nodes[peer.node_id] = peer if known is None else replace(
                known, language_models=peer.language_models)
        for node_id, node in nodes.items():
            if node_id != self.node_id:
                nodes[node_id] = replace(node, healthy=node.healthy
                                         and self.node.healthy(node_id))
        for link in self.node.links():
            links[(link.src, link.dst)] = link
        return ClusterView.build(self.node_id, nodes.values(), links.values())

    def ask(self, req: ChatRequest, prompt_tokens: int | None, easy: bool | None = None
            ) -> ChatAsk:
        t = req.tierlink
        return ChatAsk(model=req.model, privacy=t.privacy, origin=t.origin or self.node_id,
                       prompt_tokens=prompt_tokens if prompt_tokens is not None
                       else guess_tokens(req),
                       max_tokens=req.params.max_tokens, deadline_ms=t.deadline_ms,
                       ttft_ms=t.ttft_ms, min_tokens_per_s=t.min_tokens_per_s, hops=t.hops,
                       sticky=self.affinity.node_of(t.session), easy=easy,
                       features_may_leave=self.node.features_may_leave)

    def plan(self, ask: ChatAsk, view: ClusterView) -> ChatPlan:
        return plan_chat(ask, view, self.weights, self.max_hops)


def guess_tokens(req: ChatRequest) -> int:
    """A prompt's length where this node has no tokenizer (it answers with none of its own)."""
    chars = len(req.prompt) + sum(len(str(m.get("content", ""))) + 8 for m in req.messages)
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))
