"""A node's chat service: its language models, by name and by task, answering OpenAI-shaped
requests — checked and placed on arrival (model, privacy, lengths; ``policy/chat.py`` over
the cluster view), answered here, drafted here and verified upstream, or relayed to an
upstream's model, with fallback down the plan; counted in the node's metrics. A node with
no language model of its own serves the API too, relaying to the upstreams that have one.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tierlink.chat.handover import Handover
from tierlink.chat.openai import ChatRequest, answer, chunk, new_id, sse, usage
from tierlink.chat.peers import PeerModels
from tierlink.chat.placing import ChatPlacer, NodeLink
from tierlink.chat.router import load_router
from tierlink.chat.speculating import BATCH_SLOWDOWN, TIER_PRICES, Speculation, VerifierLink
from tierlink.chat.splitting import Splitting
from tierlink.core.types import ClusterView, LanguageModelView, Tier
from tierlink.errors import (
    InvalidRequest,
    ModelNotFound,
    PrivacyViolation,
    TierlinkError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from tierlink.estimate.chat import ChatEstimate
from tierlink.llm.results import Chunk, Generation
from tierlink.policy.chat import ChatAsk, ChatOption, ChatPlan
from tierlink.routing.privacy import may_hold
from tierlink.security.names import expect_node
from tierlink.telemetry.llm_metrics import LLMMetrics

if TYPE_CHECKING:
    import aiohttp

    from tierlink.llm.face import ServedModel

MODES = ("auto", "local", "speculative", "split", "remote")
RELAY_FAILURES = (UpstreamUnavailable, UpstreamTimeout)  # fall back down the plan on these


@dataclass
class Prepared:
    """A request that passed every check on arrival, with its plan: what a stream starts
    from (refusals come before it, as a status)."""

    lm: ServedModel | None  # this node's model, when it has the one asked for
    ids: list[int] | None  # the prompt's tokens (None without a local tokenizer)
    plan: ChatPlan
    meta: dict[str, Any] = field(default_factory=dict)
    view: ClusterView | None = None  # what the plan was made over


class ChatService:
    def __init__(self, node_id: str, tier: Tier, models: dict[str, ServedModel],
                 tasks: dict[str, str], metrics: LLMMetrics | None = None,
                 verifiers: dict[str, VerifierLink] | None = None,
                 upstreams: Mapping[str, str] | None = None,
                 node: NodeLink | None = None, kv_copies: bool = False,
                 splits: dict[str, VerifierLink] | None = None) -> None:
        self.node_id = node_id
        self.tier = tier
        self.models = models
        self.tasks = tasks  # task -> model name on this node
        self.metrics = metrics
        self.price = TIER_PRICES.get(tier, 0.0)
        self.verifiers = verifiers or {}  # model -> where its drafts are verified
        # node id -> base URL, read through: a node's upstreams follow the registry
        self._live: Mapping[str, str] = upstreams if upstreams is not None else {}
        self._fixed = {link.node_id: link.url
                       for link in (*self.verifiers.values(), *(splits or {}).values())}
        self._http: aiohttp.ClientSession | None = None
        self.tls: ssl.SSLContext | None = None  # HTTPS peers: the node's client context
        self.speculation = Speculation(node_id, tier, models, self.verifiers, metrics,
                                       self.http, lambda: self.tls)
        self.splitting = Splitting(node_id, splits or {}, self.http, lambda: self.tls)
        self.routers = {name: load_router(lm.source.router) for name, lm in models.items()
                        if lm.source.router}
        peers = None if upstreams is None and not self._fixed else \
            PeerModels(lambda: self.upstreams, self.http,
                       peer=lambda node_id: expect_node(node_id, self.tls))
        self.placer = ChatPlacer(node_id, tier, node or NodeLink(), peers)
        self.handover = Handover(node_id, self.http, lambda: self.tls,
                                 lambda: self.placer.node.links(), lambda: self.upstreams,
                                 self.placer.affinity, metrics, keep_copies=kv_copies)
        self.copies = self.handover.copies
        if metrics is not None:
            for name, lm in models.items():
                stats = lm.engine.stats
                metrics.watch(name, functools.partial(getattr, stats, "running"),
                              functools.partial(getattr, stats, "queued"), lm.kv_bytes_in_use)
                passes = metrics.passes.labels(tier.label, name)
                lm.engine.on_pass = lambda _rows, _s, c=passes: c.inc()

    @property
    def upstreams(self) -> dict[str, str]:
        """Where this node relays now: node id -> base URL (its verifiers' nodes too)."""
        return {**self._fixed, **self._live}

    def start(self) -> None:
        for lm in self.models.values():
            lm.start()

    async def stop(self) -> None:
        for lm in self.models.values():
            lm.stop()
        if self.placer.peers is not None:
            await self.placer.peers.stop()
        if self.copies is not None:
            await self.copies.stop()
        if self._http is not None:
            await self._http.close()

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            import aiohttp

            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                ssl=self.tls if self.tls is not None else True))
        return self._http

    # -- what this node serves ---------------------------------------------------------------

    def views(self) -> tuple[LanguageModelView, ...]:
        """This node's language models as placement (here and in heartbeats) sees them."""
        return tuple(self._view(name, lm) for name, lm in self.models.items())

    def _view(self, name: str, lm: ServedModel) -> LanguageModelView:
        lang, stats = lm.card.language, lm.engine.stats
        return LanguageModelView(
            name, tuple(t for t, m in sorted(self.tasks.items()) if m == name),
            lm.source.quality, lang.context_length if lang else lm.context_length,
            lang.prefill_tokens_per_s if lang else 100.0,
            lang.decode_tokens_per_s if lang else 10.0, BATCH_SLOWDOWN, running=stats.running,
            queued=stats.queued, max_sequences=lm.source.max_sequences,
            verifier=lm.source.verifier or "",
            acceptance=self.speculation.acceptance.get(name, 0.7),
            price_per_1k=self.price, identity=lm.identity,
            **self.splitting.view_fields(lm))

    def resolve(self, name: str) -> ServedModel:
        found = self.local_model(name)
        if found is None:
            raise ModelNotFound(f"{name!r} is neither a language model on {self.node_id} nor "
                                f"a chat task it serves",
                                hint=f"models: {sorted(self.models)}; tasks: "
                                     f"{sorted(self.tasks)}", param="model")
        return found

    def local_model(self, name: str) -> ServedModel | None:
        if name in self.models:
            return self.models[name]
        return self.models.get(self.tasks[name]) if name in self.tasks else None

    def model_list(self) -> list[dict[str, Any]]:
        out = [{"id": name, "object": "model", "created": 0, "owned_by": "tierlink",
                "tierlink": {"kind": "model", "tier": self.tier.label, "card": lm.card.to_dict(),
                             "view": self._view(name, lm).to_dict()}}
               for name, lm in sorted(self.models.items())]
        out += [{"id": task, "object": "model", "created": 0, "owned_by": "tierlink",
                 "tierlink": {"kind": "task", "model": model}}
                for task, model in sorted(self.tasks.items())]
        listed = {e["id"] for e in out}
        peers = self.placer.peers.views() if self.placer.peers is not None else []
        for node in peers:  # what this node answers by relaying
            for lm in node.language_models:
                for name in (lm.name, *lm.tasks):
                    if name not in listed:
                        listed.add(name)
                        out.append({"id": name, "object": "model", "created": 0,
                                    "owned_by": "tierlink",
                                    "tierlink": {"kind": "upstream", "via": node.node_id}})
        return out

    async def listing(self) -> dict[str, Any]:
        if self.placer.peers is not None:
            await self.placer.peers.current()
        return {"object": "list", "data": self.model_list(),
                "tierlink": {"node_id": self.node_id, "tier": self.tier.label}}

    # -- on arrival: checks and the plan -----------------------------------------------------

    def check_privacy(self, req: ChatRequest) -> None:
        """The prompt *is* the private data: refused where this node may not hold it."""
        origin = req.tierlink.origin
        if not may_hold(req.tierlink.privacy, self.tier, self.node_id, origin):
            raise PrivacyViolation(
                f"a {req.tierlink.privacy.value} prompt from {origin} may not be held by "
                f"{self.node_id} ({self.tier.label})")

    async def prepare(self, req: ChatRequest) -> Prepared:
        """Everything that can refuse the request, before a byte of the answer is sent."""
        mode = req.tierlink.mode
        if mode not in MODES:
            raise InvalidRequest(f"tierlink.mode must be one of {', '.join(MODES)}",
                                 param="tierlink")
        self.check_privacy(req)
        lm = self.local_model(req.model)
        if lm is None and mode in ("local", "speculative"):
            self.resolve(req.model)  # raises: not here
        ids = None
        if lm is not None:
            ids = lm.chat_ids(list(req.messages)) if req.kind == "chat" \
                else lm.text_ids(req.prompt)
            lm.check_length(ids, req.params)
        meta: dict[str, Any] = {}
        view = await self.placer.view(self.views())
        plan = await self._plan(req, lm, ids, meta, view)
        return Prepared(lm, ids, plan, meta, view)

    async def _plan(self, req: ChatRequest, lm: ServedModel | None, ids: list[int] | None,
                    meta: dict[str, Any], view: ClusterView) -> ChatPlan:
        """The policy's plan over ``view``, with the router's verdict."""
        mode = req.tierlink.mode
        ask = self.placer.ask(req, len(ids) if ids is not None else None)
        ask = ask if mode == "auto" else replace(ask, only=mode)
        plan = await self._routed(self.placer.plan(ask, view), ask, view, lm, ids, meta)
        missing = self._missing_verifier(req, lm, view)
        if missing is not None and mode == "speculative" and plan.empty:
            # Asked for: try it (a verifier that does not answer leaves a degraded answer).
            plan = ChatPlan((missing,), reason=f"{missing.label}: asked for")
        elif missing is not None and plan.options and plan.options[0].kind == "local":
            meta["degraded"] = True
            meta["degraded_reason"] = (f"verifier {missing.node_id} unreachable: answered "
                                       f"by this node's own model")
        if plan.empty:
            if mode != "auto":
                raise InvalidRequest(f"{mode} is not possible here: {plan.reason}",
                                     param="tierlink")
            if lm is None and not any(m.serves(req.model) for n in view.nodes.values()
                                      for m in n.language_models):
                self.resolve(req.model)  # raises: unknown here and upstream (404)
            raise _refusal(self.node_id, plan.reason)
        return plan

    async def _routed(self, plan: ChatPlan, ask: ChatAsk, view: ClusterView,
                      lm: ServedModel | None, ids: list[int] | None,
                      meta: dict[str, Any]) -> ChatPlan:
        """Re-planned with the difficulty router's verdict, when this model has a router
        and the plan leaves a choice between it and another."""
        router = self.routers.get(lm.name) if lm is not None else None
        kinds = {o.kind for o in plan.options}
        if router is None or lm is None or ids is None or "local" not in kinds \
                or len(kinds) < 2:
            return plan
        score = float(router.scores(await lm.prompt_features(ids))[0])
        meta["difficulty"] = round(score, 4)
        return self.placer.plan(replace(ask, easy=score <= router.threshold), view)

    def _missing_verifier(self, req: ChatRequest, lm: ServedModel | None,
                          view: ClusterView) -> ChatOption | None:
        """This model's verifier, when the prompt may go there but the view lacks it (down,
        or never heard from)."""
        link = self.verifiers.get(lm.name) if lm is not None else None
        if lm is None or link is None or not req.tierlink.privacy.allows(link.tier,
                                                                         at_origin=False):
            return None
        node = view.nodes.get(link.node_id)
        if node is not None and node.healthy and any(m.name == link.model
                                                     for m in node.language_models):
            return None
        return ChatOption("speculative", link.node_id, link.model, lm.name,
                          ChatEstimate(0.0, 0.0, 0.0, None))

    # -- answering ---------------------------------------------------------------------------

    async def pieces(self, req: ChatRequest, prep: Prepared, report: Generation,
                     meta: dict[str, Any]) -> AsyncIterator[Chunk]:
        """The answer's pieces from the plan's first option that answers; an upstream that
        fails before its first piece hands over to the next option."""
        meta.update(prep.meta)
        fallbacks: list[dict[str, str]] = []
        options = prep.plan.options
        for i, option in enumerate(options):
            placement = {"reason": prep.plan.reason if i == 0 else "fallback",
                         "est_ttft_ms": round(option.est.ttft_ms, 1),
                         "est_tokens_per_s": round(option.est.tokens_per_s, 2),
                         "fallbacks": fallbacks}
            started = False
            try:
                async for piece in self._answer(option, req, prep, report, meta):
                    started = True
                    yield piece
            except RELAY_FAILURES as exc:
                if started or i == len(options) - 1:
                    raise
                fallbacks.append({"node_id": option.node_id, "reason": exc.code,
                                  "detail": exc.message})
                report.text.clear()
                continue
            finally:  # this node's placement, not the one an upstream made for itself
                meta["placement"] = placement
            if option.kind == "local" and prep.meta.get("degraded"):
                meta.update(degraded=True, degraded_reason=prep.meta["degraded_reason"])
            elif not meta.get("degraded"):
                self.placer.affinity.served(req.tierlink.session, option.node_id)
            return

    def _answer(self, option: ChatOption, req: ChatRequest, prep: Prepared,
                report: Generation, meta: dict[str, Any]) -> AsyncIterator[Chunk]:
        if option.kind == "remote":
            return self._remote(req, option, prep, report, meta)
        lm, ids = prep.lm, prep.ids
        assert lm is not None and ids is not None  # local options come from local models
        if option.kind == "speculative":
            return self._speculative(req, lm, ids, report, meta)
        if option.kind == "split":
            return self.splitting.answer(req, lm, ids, report, meta)
        return self._local(req, lm, ids, report, meta)

    async def _local(self, req: ChatRequest, lm: ServedModel, ids: list[int],
                     report: Generation, meta: dict[str, Any]) -> AsyncIterator[Chunk]:
        meta.update(self.meta(lm, report))
        t = req.tierlink
        async for piece in lm.generate(ids, req.params, t.session, report, t.privacy,
                                       t.origin or self.node_id):
            yield piece
        meta.update(self.meta(lm, report))

    async def _speculative(self, req: ChatRequest, lm: ServedModel, ids: list[int],
                           report: Generation, meta: dict[str, Any]) -> AsyncIterator[Chunk]:
        meta.update(self.meta(lm, report))
        async for piece in self.speculation.answer(req, lm, ids, report, meta):
            yield piece

    async def _remote(self, req: ChatRequest, option: ChatOption, prep: Prepared,
                      report: Generation, meta: dict[str, Any]) -> AsyncIterator[Chunk]:
        """The upstream's model answers alone; this node relays (cloud-only, via here),
        having shipped the conversation's cache there when it should go."""
        from tierlink.chat.remote import forward_body, relay

        upstream: dict[str, Any] = {}
        url = self.upstreams.get(option.node_id)
        if url is None:  # it left this node's upstreams since it was placed
            raise UpstreamUnavailable(f"{option.node_id} is no longer an upstream of "
                                      f"{self.node_id}", hint="retry: it is placed anew")
        moved = await self.handover.before_relay(req, prep, option, url)
        if moved is not None:
            meta["kv"] = moved
        try:
            async for piece in relay(self.http(), url,
                                     forward_body(req, option.model, self.node_id), report,
                                     upstream, expect_node(option.node_id, self.tls)):
                yield piece
            if self.copies is not None and req.tierlink.session is not None \
                    and upstream.get("served_by") == option.node_id:
                self.copies.after_turn(req.tierlink.session, option.node_id, option.model)
        finally:
            meta.update(upstream)
            meta["path"] = [self.node_id, *upstream.get("path", [option.node_id])]
            meta["mode"] = "remote"

    async def complete(self, req: ChatRequest, prep: Prepared) -> dict[str, Any]:
        report = Generation()
        meta: dict[str, Any] = {}
        start = time.monotonic()
        name = _label(prep, req)
        try:
            async for _ in self.pieces(req, prep, report, meta):
                pass
        except TierlinkError as exc:
            self._count(name, exc.code)
            raise
        self._observe(name, report, start)
        use = usage(report.prompt_tokens, report.completion_tokens, report.cached_tokens)
        return answer(req, new_id(req.kind), req.model, "".join(report.text),
                      report.finish_reason, use, meta)

    async def stream(self, req: ChatRequest, prep: Prepared) -> AsyncIterator[bytes]:
        """SSE frames; a client that goes away cancels the sequence (the generator closes)."""
        rid = new_id(req.kind)
        report = Generation()
        meta: dict[str, Any] = {}
        start = time.monotonic()
        first = True
        outcome = "cancelled"
        name = _label(prep, req)
        try:
            async for piece in self.pieces(req, prep, report, meta):
                if piece.text or first or piece.finish_reason:
                    yield sse(chunk(req, rid, req.model, piece.text, piece.finish_reason,
                                    first))
                    first = False
            outcome = "ok"
        except TierlinkError as exc:
            outcome = exc.code
            from tierlink.chat.openai import error_body

            yield sse(error_body(exc))
        finally:
            if outcome == "ok":
                self._observe(name, report, start)
            else:
                self._count(name, outcome)
        if req.include_usage:
            tail = chunk(req, rid, req.model, None, None)
            tail["choices"] = []
            tail["usage"] = usage(report.prompt_tokens, report.completion_tokens,
                                  report.cached_tokens)
            tail["tierlink"] = meta
            yield sse(tail)
        yield sse("[DONE]")

    def meta(self, lm: ServedModel, report: Generation) -> dict[str, Any]:
        tokens = report.completion_tokens + (report.prompt_tokens - report.cached_tokens) / 5
        return {"served_by": self.node_id, "tier": self.tier.label, "model": lm.name,
                "path": [self.node_id], "mode": "local",
                "cost_usd": round(tokens / 1000 * self.price, 8),
                "drafted": 0, "accepted": 0, "degraded": False}

    def _observe(self, model: str, report: Generation, start: float) -> None:
        m = self.metrics
        if m is None:
            return
        labels = (self.tier.label, model)
        m.requests.labels(*labels, "ok").inc()
        m.prompt_tokens.labels(*labels).inc(report.prompt_tokens)
        m.cached_tokens.labels(*labels).inc(report.cached_tokens)
        m.generation_tokens.labels(*labels).inc(report.completion_tokens)
        t = report.timing
        if t is not None and t.first_token is not None:
            m.ttft.labels(*labels).observe(t.first_token - t.submitted)
            if t.finished is not None and report.completion_tokens > 1:
                per = (t.finished - t.first_token) / (report.completion_tokens - 1)
                m.tpot.labels(*labels).observe(per)

    def _count(self, model: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.requests.labels(self.tier.label, model, outcome).inc()


def _label(prep: Prepared, req: ChatRequest) -> str:
    """The model name metrics count a request under: this node's, or the one asked for."""
    return prep.lm.name if prep.lm is not None else req.model


def _refusal(node_id: str, reason: str) -> TierlinkError:
    from tierlink.errors import NoFeasiblePlacement

    return NoFeasiblePlacement(f"{node_id}: {reason}")
