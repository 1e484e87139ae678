"""Latency model: T = queue wait + compute + transfer(bytes, link) + per-hop overhead.

All inputs come from a snapshot (``NodeView``, ``ModelView``, ``LinkView``); nothing here reads
a clock or does I/O, so the live router and the simulator share it.
"""

from __future__ import annotations

from collections import deque
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


REQUEST_COST_WINDOW = 9  # real requests whose median extra cost is request_ms
FRESH_REQUESTS = 3  # real requests after a probe round that request_ms is learned from
PROBE_MEMORY = 4  # probes of one size whose fastest is that size's floor


class LinkEstimator:
    """Estimate of one link's RTT and bandwidth from real traffic, seeded from its declaration.

    Fed by the dispatcher with what each exchange shows: ``observe(total_ms, server_ms,
    nbytes)``, where ``total_ms`` is the hop's wall time and ``server_ms`` what the far side
    reports it spent; the rest is network time ``rtt + nbytes * 8 / bandwidth``. When the
    recent window holds payloads of clearly different sizes (small requests beside split
    features or a probe), a least-squares line through (bytes, network ms) gives both the RTT
    (intercept) and the bandwidth (slope); otherwise the bandwidth is kept and the RTT
    follows an EWMA. The window is short (``window`` exchanges), so a bandwidth change shows
    within that many exchanges. Pure arithmetic; the caller owns the clock.

    Probes (``probe=True``: padding to an endpoint that answers at once, sent while the link
    is idle) measure the bare wire, but a real request also pays for the HTTP stacks, OIP
    encoding and the sender's own CPU (tens of ms on a throttled device). So the estimator
    keeps the probes' own line too, learns ``request_ms`` — the median of how far the first
    real requests after a probe round land above it — and enters each probe into the shared
    window as ``probe + request_ms``:
    the view stays in *request* terms whether the link was last busy or idle.

    A probe's own time is noisy in one direction only: a sender whose CPU is busy (a
    throttled device computing locally is idle *on the link* but stalled for tens of ms at a
    time) can only make it slower. So each probe enters as the *floor* of its size — the
    fastest of the last ``PROBE_MEMORY`` probes of that size — and the probes' line goes
    through those floors. An improvement shows at the first clean probe; a slowdown once
    ``PROBE_MEMORY`` probes in a row were slower (a few idle seconds; real traffic shows it
    sooner).
    """

    def __init__(self, prior: LinkView, alpha: float = 0.2, hop_overhead_ms: float = 0.0,
                 window: int = 16, min_spread_bytes: int = 16_384) -> None:
        self._prior = prior
        self._alpha = alpha
        self._overhead = hop_overhead_ms
        self._rtt_ms = prior.rtt_ms
        self._bandwidth = prior.bandwidth_mbit
        self._window: deque[tuple[int, float]] = deque(maxlen=max(2, window))
        self._probed: deque[bool] = deque(maxlen=max(2, window))  # which window entries are probes
        self._probes: deque[tuple[int, float]] = deque(maxlen=4 * PROBE_MEMORY)
        self._extras: deque[float] = deque(maxlen=REQUEST_COST_WINDOW)
        self._min_spread = min_spread_bytes
        self._since_probe = 0  # real requests since the last probe
        self.request_ms = 0.0  # what a real request costs above the probes' line
        self.samples = 0

    def observe(self, total_ms: float, server_ms: float, nbytes: int, *,
                probe: bool = False) -> None:
        """Fold one exchange of ``nbytes`` (request + response payload) in."""
        net = max(0.0, total_ms - server_ms - self._overhead)
        if probe:
            self._probes.append((int(nbytes), net))
            self._since_probe = 0
            self._refloor()
            net = _floors(self._probes)[int(nbytes)] + self.request_ms
        else:
            self._learn_request_cost(nbytes, net)
        self._window.append((int(nbytes), net))
        self._probed.append(probe)
        self.samples += 1
        fit = _line(self._window, self._min_spread, self._bandwidth)
        if fit is not None:
            self._rtt_ms, self._bandwidth = fit
            return
        serial = nbytes * 8.0 / (self._bandwidth * 1000.0) if self._bandwidth > 0 else 0.0
        self._rtt_ms += self._alpha * (max(0.0, net - serial) - self._rtt_ms)

    def _refloor(self) -> None:
        """Move the probes already in the window to their size's current floor, so the
        window never mixes a stale floor with a fresh one, and drop the real exchanges from
        it: a probe means the link was idle, so they are older than what the probes show
        (one raw input sent before the link got faster would outweigh every probe after it:
        its size gives it the leverage), and what they add above the wire is ``request_ms``."""
        floors = _floors(self._probes)
        kept = [(nbytes, floors.get(nbytes, ms - self.request_ms) + self.request_ms)
                for (nbytes, ms), probed in zip(self._window, self._probed, strict=True)
                if probed]
        self._window.clear()
        self._window.extend(kept)
        self._probed.clear()
        self._probed.extend([True] * len(kept))

    def _learn_request_cost(self, nbytes: int, net: float) -> None:
        """``request_ms``: what real requests typically spend above the probes' line, learned
        only from the first few requests after a probe round. Later ones may have met a
        link that changed since (its extra serialisation is not request cost), and nothing
        corrects that while the policy keeps the work off the link: every probe would carry
        the error into the window for good. The lower quartile of the recent ones, not the
        median: the requests that straddle a slowdown (the first few after a probe round
        when the link drops right after it: three raw uploads at 3 Mbit/s read as 1.6 s of
        "request cost" each) and a sender's stalls only ever add, and with a median three
        such straddlers of six kept a recovered link priced 100 ms too slow for good."""
        self._since_probe += 1
        wire = _line(deque(_floors(self._probes).items()), self._min_spread, self._bandwidth,
                     min_points=2)
        if wire is None or self._since_probe > FRESH_REQUESTS:
            return
        rtt, bandwidth = wire
        self._extras.append(max(0.0, net - rtt - nbytes * 8.0 / (bandwidth * 1000.0)))
        self.request_ms = sorted(self._extras)[(len(self._extras) - 1) // 4]

    def view(self) -> LinkView:
        p = self._prior
        return LinkView(p.src, p.dst, rtt_ms=self._rtt_ms, bandwidth_mbit=self._bandwidth,
                        loss=p.loss)


def _floors(probes: deque[tuple[int, float]]) -> dict[int, float]:
    """Per probe size, the fastest of its last ``PROBE_MEMORY`` probes (oldest first in
    ``probes``): a sender's stalls only ever add time, so the floor is the wire's."""
    recent: dict[int, list[float]] = {}
    for nbytes, ms in reversed(probes):
        kept = recent.setdefault(nbytes, [])
        if len(kept) < PROBE_MEMORY:
            kept.append(ms)
    return {nbytes: min(kept) for nbytes, kept in recent.items()}


def _line(window: deque[tuple[int, float]], min_spread: int, bandwidth: float,
          min_points: int = 4) -> tuple[float, float] | None:
    """(rtt_ms, bandwidth_mbit) by least squares over (bytes, ms), or None when the sizes
    barely differ. A flat or falling slope keeps ``bandwidth`` and fits the RTT alone."""
    sizes = [b for b, _ in window]
    if len(sizes) < min_points or max(sizes) - min(sizes) < min_spread:
        return None
    n = len(sizes)
    mean_b = sum(sizes) / n
    mean_t = sum(t for _, t in window) / n
    var = sum((b - mean_b) ** 2 for b in sizes)
    cov = sum((b - mean_b) * (t - mean_t) for b, t in window)
    slope = cov / var  # ms per byte
    if slope <= 1e-9:  # faster than this can measure
        return max(0.0, mean_t), bandwidth
    fitted = min(100_000.0, max(0.01, 8.0 / (slope * 1000.0)))
    return max(0.0, mean_t - slope * mean_b), fitted
