"""Forwarding a request to an upstream: what is left of the deadline goes with it, the
client's labels and the trace context too; the exchange teaches the link estimate and the
answer carries the transfer's cost. (A split plan's hop is ``SplitPlans.run_split``.)"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from tierlink.core.types import Placement, Request
from tierlink.errors import DeadlineExceeded, UpstreamUnavailable
from tierlink.node import protocol
from tierlink.node.dispatcher import StepResult
from tierlink.node.splits import SplitPlans, Upstream
from tierlink.settings.routing import RoutingConfig
from tierlink.telemetry import tracing
from tierlink.transport.client import OipClient

__all__ = ["LABELS", "Forwarder"]

# The client's labels (``tierlink.label``) of the request being routed. They are not part of
# the core ``Request`` (nothing in routing reads them); like the trace context, they ride the
# request's async context from ``infer_task`` to the hop that forwards them and to the
# hard-example hook, both called from within that same task.
LABELS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "tierlink_labels", default=None)


class Forwarder:
    def __init__(self, upstreams: Mapping[str, Upstream], client: OipClient,
                 routing: RoutingConfig, clock: Callable[[], float], split: SplitPlans,
                 day_s: Callable[[], float] = lambda: 0.0) -> None:
        self._upstreams, self._client, self._routing = upstreams, client, routing
        self._clock, self._split = clock, split
        self._day_s = day_s  # when prices are read: the node's snapshot's time of day
        self.outstanding: dict[str, int] = {}  # node -> requests sent there, not answered

    async def run_remote(self, placement: Placement, req: Request,
                          inputs: dict[str, np.ndarray], remaining_ms: float,
                          budget_ms: float) -> StepResult:
        if placement.cut:
            return await self._split.run_split(placement, req, inputs, budget_ms)
        up = self._upstreams.get(placement.node_id)
        if up is None:  # dropped (drained, expired) since the plan was made
            raise UpstreamUnavailable(f"{placement.node_id} is no longer an upstream of this "
                                      "node", hint="the fleet changed; send the request again")
        link = up.estimator.view()
        send_ms = budget_ms - link.rtt_ms - self._routing.reserve_ms
        if send_ms <= 0:
            raise DeadlineExceeded(f"no time left for the hop to {placement.node_id} "
                                   f"({budget_ms:.1f} ms left, link RTT {link.rtt_ms:.1f} ms)")
        node = placement.node_id
        self.outstanding[node] = self.outstanding.get(node, 0) + 1
        start = self._clock()
        try:
            with tracing.stage("tierlink.upstream", {
                    "tierlink.peer": node, "tierlink.bytes": req.input_bytes,
                    "tierlink.budget_ms": budget_ms, "server.address": up.spec.url}):
                params = protocol.forward_params(req, send_ms, tracing.current_traceparent(),
                                                 LABELS.get())
                resp = await self._client.infer(up.spec.url, req.task, inputs, params,
                                                timeout_s=budget_ms / 1000.0,
                                                request_id=req.request_id, peer=node)
        finally:
            self.outstanding[node] -= 1
        total_ms = (self._clock() - start) * 1000.0
        outcome = protocol.parse_outcome(resp.parameters)
        up.estimator.observe(total_ms, outcome.timings_ms.get("server_ms", 0.0), req.input_bytes)
        up.last_seen = up.last_used = self._clock()
        transfer = self._routing.cost.at(self._day_s()).transfer_bill(placement.tier,
                                                                      req.input_bytes)
        return StepResult(resp.outputs, replace(outcome, bill=outcome.bill + transfer))
