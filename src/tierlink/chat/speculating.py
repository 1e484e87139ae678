"""Answers drafted here and verified upstream (speculative decoding across tiers): each of
this node's drafting models, where its drafts are verified, and how often they are taken.

A device's model drafts k tokens, the verifier's model judges them in one pass
(``chat/verify.py``); what the answer cost and who served it are the verifier's unless it
was unreachable (the answer is then the device's own: degraded). The acceptance seen per
model (an EWMA) is what placement prices the next speculative option with.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierlink.core.types import Tier
from tierlink.llm.results import Chunk, Generation
from tierlink.security.names import expect_node

if TYPE_CHECKING:
    import aiohttp

    from tierlink.llm.face import ServedModel
    from tierlink.llm.speculative import SpecReport
    from tierlink.telemetry.llm_metrics import LLMMetrics

# Cost per 1,000 generated tokens on each tier (prompt tokens count a fifth).
TIER_PRICES = {Tier.DEVICE: 0.0, Tier.EDGE: 0.0005, Tier.CLOUD: 0.002}
BATCH_SLOWDOWN = 0.1  # one more row in a decoding step costs this share of a one-row step


@dataclass(frozen=True, slots=True)
class VerifierLink:
    """Where a device's drafts for one of its models are verified."""

    node_id: str
    url: str
    model: str
    tier: Tier


class Speculation:
    def __init__(self, node_id: str, tier: Tier, models: Mapping[str, ServedModel],
                 verifiers: Mapping[str, VerifierLink], metrics: LLMMetrics | None,
                 http: Callable[[], aiohttp.ClientSession],
                 tls: Callable[[], ssl.SSLContext | None]) -> None:
        self.node_id = node_id
        self.tier = tier
        self.verifiers = dict(verifiers)  # model -> where its drafts are verified
        self.metrics = metrics
        self._http = http
        self._tls = tls
        self.drafters = _drafters(models, self.verifiers)
        self.acceptance: dict[str, float] = {}  # EWMA per drafting model
        self._background: set[asyncio.Future[None]] = set()

    async def answer(self, req: Any, lm: ServedModel, ids: list[int], report: Generation,
                     meta: dict[str, Any]) -> AsyncIterator[Chunk]:
        """``req`` (a ``ChatRequest``) answered by drafting with ``lm`` here; ``meta`` gets
        who served it, its cost and the round's timings."""
        from tierlink.chat.verify import HttpVerifier
        from tierlink.llm.speculative import SpecReport

        link = self.verifiers[lm.name]
        spec = SpecReport()
        verifier = HttpVerifier(self._http(), link.url, link.model,
                                key=f"{self.node_id}:{uuid.uuid4().hex}",
                                timeout_s=req.tierlink.deadline_ms / 1e3,
                                server_hostname=expect_node(link.node_id, self._tls()))
        try:
            async for piece in self.drafters[lm.name].generate(
                    ids, req.params, verifier, report, spec, ahead=req.tierlink.draft_ahead):
                yield piece
        finally:
            if spec.rounds and not spec.degraded:  # free its cache there, without waiting
                task = asyncio.ensure_future(verifier.close())
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            meta.update(self._meta(lm, link, report, spec))
            meta["timings_s"] = {"draft": round(spec.draft_s, 4),
                                 "round_trips": round(spec.verify_s, 4),
                                 "verifier_server": round(verifier.server_s, 4)}

    def _meta(self, lm: ServedModel, link: VerifierLink, report: Generation,
              spec: SpecReport) -> dict[str, Any]:
        # The verifier's passes, each of k+1 rows costing 1 + 0.1·k single-token steps.
        steps = spec.rounds + BATCH_SLOWDOWN * spec.drafted
        price = TIER_PRICES.get(link.tier, 0.0)
        cost = (steps + report.prompt_tokens / 5) / 1000 * price if spec.rounds else 0.0
        if spec.drafted:
            seen = self.acceptance.get(lm.name, 0.7)
            self.acceptance[lm.name] = seen + 0.3 * (spec.accepted / spec.drafted - seen)
        if self.metrics is not None:
            labels = (self.tier.label, lm.name, "draft")
            self.metrics.draft_tokens.labels(*labels).inc(spec.drafted)
            self.metrics.accepted_tokens.labels(*labels).inc(spec.accepted)
        return {"served_by": self.node_id if spec.degraded else link.node_id,
                "tier": self.tier.label if spec.degraded else link.tier.label,
                "model": lm.name if spec.degraded else link.model,
                "path": [self.node_id, link.node_id], "mode": "speculative",
                "cost_usd": round(cost, 8), "drafted": spec.drafted,
                "accepted": spec.accepted, "rounds": spec.rounds,
                "mean_k": round(spec.mean_k, 2), "ahead_hits": spec.ahead_hits,
                "degraded": spec.degraded,
                "degraded_reason": spec.reason}


def _drafters(models: Mapping[str, ServedModel], verifiers: Mapping[str, VerifierLink]
              ) -> dict[str, Any]:
    if not verifiers:
        return {}
    from tierlink.llm.speculative import SpeculativeDrafter

    return {name: SpeculativeDrafter(models[name].draft_model(), models[name].codec,
                                     models[name].source.k_max, models[name].source.draft_ahead)
            for name in verifiers}
