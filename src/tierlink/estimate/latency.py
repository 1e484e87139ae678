"""Latency model: T = queue wait + compute + transfer(bytes, link) + per-hop overhead.

All inputs come from a snapshot (``NodeView``, ``ModelView``, ``LinkView``); nothing here reads
a clock or does I/O, so the live router and the simulator share it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierlink.core.types import LinkView, ModelView, NodeView


@dataclass(frozen=True, slots=True)
class EstimateParams:
    """Constants of the latency model that are not measured per request."""

    hop_overhead_ms: float = 2.0  # HTTP + (de)serialisation of one forwarding hop
    request_overhead_bytes: int = 700  # OIP JSON header around the tensor bytes
    response_bytes: int = 600  # a classification answer with its routing parameters


def transfer_ms(nbytes: int, link: LinkView) -> float:
    """One request/response exchange of ``nbytes`` upstream over ``link``: RTT + serialisation.

    Bandwidth is in Mbit/s, i.e. 1,000 bits per millisecond per Mbit/s.
    """
    if link.bandwidth_mbit <= 0:
        return link.rtt_ms
    return link.rtt_ms + nbytes * 8.0 / (link.bandwidth_mbit * 1000.0)


def queue_wait_ms(node: NodeView, model: ModelView, outstanding: int = 0) -> float:
    """Expected wait before ``model`` starts on ``node``: the work ahead, spread over workers.

    ``queue_depth`` comes from the node's last heartbeat; ``outstanding`` is what this router
    itself has sent there since (live), so a burst is seen before the next heartbeat.
    """
    ahead = node.queue_depth + max(0, node.inflight - node.workers) + outstanding
    return ahead * model.latency_ms / max(1, node.workers)


class LinkEstimator:
    """EWMA estimate of one link's RTT and bandwidth, seeded from its declaration.

    Fed by the dispatcher with what real traffic shows: ``observe(total_ms, server_ms, nbytes)``
    where ``total_ms`` is the hop's wall time and ``server_ms`` what the far side reports it
    spent. Pure arithmetic; the caller owns the clock.
    """

    def __init__(self, prior: LinkView, alpha: float = 0.2, hop_overhead_ms: float = 0.0) -> None:
        self._prior = prior
        self._alpha = alpha
        self._overhead = hop_overhead_ms
        self._rtt_ms = prior.rtt_ms
        self._bandwidth = prior.bandwidth_mbit
        self.samples = 0

    def observe(self, total_ms: float, server_ms: float, nbytes: int) -> None:
        """Fold one exchange in. Network time = total − server − serialisation at the estimate."""
        serial = nbytes * 8.0 / (self._bandwidth * 1000.0) if self._bandwidth > 0 else 0.0
        rtt = max(0.0, total_ms - server_ms - serial - self._overhead)
        self._rtt_ms += self._alpha * (rtt - self._rtt_ms)
        self.samples += 1

    def view(self) -> LinkView:
        p = self._prior
        return LinkView(p.src, p.dst, rtt_ms=self._rtt_ms, bandwidth_mbit=self._bandwidth, loss=p.loss)
