"""Where a chat request is answered: a pure decision over the cluster view, like ``plan``
for tensor requests (``policy/placement.py``).

Options: this node's own language model (``local``), drafting here for the verifier its
model names (``speculative``), running its first layers here and the rest on the upstream
its model names (``split``), or an upstream's model relayed here (``remote``). In order:

1. **Privacy** first: the prompt *is* the private data. A ``local`` prompt is answered on
   its origin device only, a ``site`` prompt never reaches the cloud, and nothing reaches a
   node whose breaker is open. A split sends the prompt's hidden states, not its text:
   allowed where the prompt's *features* may go (``Privacy.features_allowed``: a ``local``
   prompt's only where the fleet sets ``routing.local_features_may_leave``).
2. **Hard limits**: the prompt and its ``max_tokens`` fit the model's context; the
   estimated time to first token fits ``ttft_ms`` (or the whole ``deadline_ms`` when no TTFT
   target is given), and the estimated tokens/s reaches ``min_tokens_per_s``.
3. **Affinity**: a follow-up turn of a conversation goes to the node that holds its cache
   (``sticky``) while that option is feasible.
4. **Score** among the rest (the tensor policy's weights): quality in points − TTFT as a
   share of its budget − cost as a share of the dearest option's. A difficulty router's
   verdict decides whether quality counts: for a prompt it calls easy, the small model's
   answer is as good as the large one's, so only time and cost are left; for one it calls
   hard, only the large model's answer counts as right.

Feasible options come ranked (the dispatcher falls back down the list); when none is
feasible the plan is empty and ``reason`` says what was missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from tierlink.core.types import ClusterView, LanguageModelView, LinkView, NodeView, Privacy
from tierlink.estimate import chat as est
from tierlink.policy.base import Weights

ChatKind = Literal["local", "speculative", "split", "remote"]
DEFAULT_TTFT_BUDGET_MS = 2000.0  # what "fast" is measured against without a TTFT target


@dataclass(frozen=True, slots=True)
class ChatAsk:
    """What the placement knows of one chat request at the node deciding it."""

    model: str  # a chat task or a model name
    privacy: Privacy
    origin: str
    prompt_tokens: int
    max_tokens: int
    deadline_ms: float
    ttft_ms: float | None = None
    min_tokens_per_s: float | None = None
    hops: int = 0
    sticky: str | None = None  # the node holding this conversation's cache
    easy: bool | None = None  # a difficulty router's verdict (None: no router)
    only: str | None = None  # the caller chose the kind (``tierlink.mode``): no time limits
    features_may_leave: bool = False  # the fleet's routing.local_features_may_leave


@dataclass(frozen=True, slots=True)
class ChatOption:
    kind: ChatKind
    node_id: str  # who answers: this node (local), the verifier, or the upstream
    model: str  # the model on ``node_id``
    local_model: str  # this node's model (local, and the draft of a speculative option)
    est: est.ChatEstimate

    @property
    def label(self) -> str:
        return f"{self.kind} {self.model}@{self.node_id}"


@dataclass(frozen=True, slots=True)
class ChatPlan:
    options: tuple[ChatOption, ...]
    reason: str = ""

    @property
    def empty(self) -> bool:
        return not self.options


def plan_chat(ask: ChatAsk, view: ClusterView, weights: Weights | None = None,
              max_hops: int = 3) -> ChatPlan:
    options = [o for o in _options(ask, view, max_hops) if ask.only in (None, o.kind)]
    if not options:
        return ChatPlan((), reason=_why_nothing(ask, view))
    feasible = [o for o in options if _fits(ask, o)]
    if not feasible:
        return ChatPlan((), reason=_why_infeasible(ask, options))
    ranked = sorted(feasible, key=lambda o: -_score(ask, o, feasible, weights or Weights()))
    sticky = [o for o in ranked if o.node_id == ask.sticky]
    ranked = sticky[:1] + [o for o in ranked if o not in sticky[:1]]
    first = ranked[0]
    why = "the conversation's cache is there" if sticky else "best score"
    return ChatPlan(tuple(ranked), reason=f"{first.label}: {why}")


def _options(ask: ChatAsk, view: ClusterView, max_hops: int) -> Iterator[ChatOption]:
    me = view.me
    fits_context = [lm for lm in me.language_models
                    if lm.serves(ask.model) and _context_ok(ask, lm)]
    if ask.privacy.allows(me.tier, at_origin=ask.origin == me.node_id):
        for lm in fits_context:
            yield ChatOption("local", me.node_id, lm.name, lm.name,
                             est.local(lm, ask.prompt_tokens, ask.max_tokens))
    for lm in fits_context:
        for option in (_speculative(ask, view, lm), _split(ask, view, lm)):
            if option is not None:
                yield option
    if ask.hops >= max_hops:
        return
    for node in view.upstream_of(me.node_id):
        if not _may_hold(ask, node):
            continue
        link = view.link(me.node_id, node.node_id)
        rtt = link.rtt_ms if link is not None else 0.0
        for lm in node.language_models:
            if lm.serves(ask.model) and _context_ok(ask, lm):
                yield ChatOption("remote", node.node_id, lm.name, "",
                                 est.remote(lm, ask.prompt_tokens, ask.max_tokens, rtt))


def _speculative(ask: ChatAsk, view: ClusterView, draft: LanguageModelView
                 ) -> ChatOption | None:
    """Drafting with ``draft`` for the verifier it names, when the prompt may go there."""
    found = _upstream_model(view, draft.verifier)
    if found is None or not _may_hold(ask, found[0]) or not _context_ok(ask, found[1]):
        return None
    node, target, link = found
    return ChatOption("speculative", node.node_id, target.name, draft.name,
                      est.speculative(draft, target, ask.prompt_tokens, ask.max_tokens,
                                      link.rtt_ms))


def _split(ask: ChatAsk, view: ClusterView, head: LanguageModelView) -> ChatOption | None:
    """Running ``head``'s first layers here and the rest on the upstream it names, when the
    prompt's features may go there."""
    found = _upstream_model(view, head.split)
    if found is None or not _context_ok(ask, found[1]):
        return None
    node, target, link = found
    if not node.healthy or not ask.privacy.features_allowed(
            node.tier, local_may_leave=ask.features_may_leave):
        return None
    return ChatOption("split", node.node_id, target.name, head.name,
                      est.split(head, target, ask.prompt_tokens, ask.max_tokens, link.rtt_ms))


def _upstream_model(view: ClusterView, named: str
                    ) -> tuple[NodeView, LanguageModelView, LinkView] | None:
    """The node, model and link a ``NODE/MODEL`` reference names, when all three are in
    the view."""
    node_id, _, model = named.partition("/")
    node = view.nodes.get(node_id)
    link = view.link(view.self_id, node_id)
    target = next((lm for lm in node.language_models if lm.name == model), None) \
        if node is not None else None
    if node is None or target is None or link is None:
        return None
    return node, target, link


def _may_hold(ask: ChatAsk, node: NodeView) -> bool:
    return node.healthy and ask.privacy.allows(node.tier, at_origin=node.node_id == ask.origin)


def _context_ok(ask: ChatAsk, lm: LanguageModelView) -> bool:
    return ask.prompt_tokens + ask.max_tokens <= lm.context


def _ttft_budget(ask: ChatAsk) -> float:
    return min(ask.ttft_ms or ask.deadline_ms, ask.deadline_ms)


def _fits(ask: ChatAsk, o: ChatOption) -> bool:
    if ask.only is not None:
        return True
    if o.est.ttft_ms > _ttft_budget(ask):
        return False
    return ask.min_tokens_per_s is None or o.est.tokens_per_s >= ask.min_tokens_per_s


def _score(ask: ChatAsk, o: ChatOption, among: list[ChatOption], w: Weights) -> float:
    quality_term = 100.0 * _quality(ask, o, among)
    budget = ask.ttft_ms or DEFAULT_TTFT_BUDGET_MS
    dearest = max(x.est.cost_per_1k for x in among)
    cost_term = o.est.cost_per_1k / dearest if dearest > 0 else 0.0
    return w.accuracy * quality_term - w.latency * o.est.ttft_ms / budget - w.cost * cost_term


def _quality(ask: ChatAsk, o: ChatOption, among: list[ChatOption]) -> float:
    """How likely this option answers this prompt well. A router's verdict is a prediction
    for this very prompt: easy = this node's model answers it as well as the large one (so
    quality decides nothing), hard = only the large one does. Without a router, each
    model's measured quality; an unmeasured one counts as the worst measured (never a
    reason to prefer it)."""
    if ask.easy is True:
        return 0.0
    if ask.easy is False:
        return 0.0 if o.kind == "local" else 1.0
    known = [x.est.quality for x in among if x.est.quality is not None]
    return o.est.quality if o.est.quality is not None else min(known, default=0.0)


def _why_nothing(ask: ChatAsk, view: ClusterView) -> str:
    kind = f" as {ask.only}" if ask.only else ""
    return (f"no node reachable from {view.self_id} serves {ask.model!r}{kind} to a "
            f"{ask.privacy.value} prompt of {ask.prompt_tokens} tokens with max_tokens "
            f"{ask.max_tokens}")


def _why_infeasible(ask: ChatAsk, options: list[ChatOption]) -> str:
    fastest = min(options, key=lambda o: o.est.ttft_ms)
    quickest = max(options, key=lambda o: o.est.tokens_per_s)
    if fastest.est.ttft_ms > _ttft_budget(ask):
        return (f"a first token within {_ttft_budget(ask):.0f} ms cannot be had: the "
                f"fastest option ({fastest.label}) needs about {fastest.est.ttft_ms:.0f} ms")
    return (f"{ask.min_tokens_per_s} tokens/s cannot be had: the quickest option "
            f"({quickest.label}) gives about {quickest.est.tokens_per_s:.1f}")
