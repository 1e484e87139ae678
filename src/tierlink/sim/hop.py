"""A simulated call upstream: the request's HTTP work, the payload over the link, the work
done there, the answer back — under the caller's timeout, with callbacks on virtual time.

What it keeps of the live hop: a host whose process is down refuses the connection at once;
a node that crashes while holding a request never answers it (the connection is reset); a
call that runs out of its budget is given up (``UpstreamTimeout``) and everything it started
upstream is cancelled, as cancelling the live node's coroutine cancels its HTTP request.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tierlink.errors import TierlinkError, UpstreamTimeout, UpstreamUnavailable
from tierlink.sim.dispatch import Chain, Done
from tierlink.sim.http import HttpCosts
from tierlink.sim.links import SimLink

if TYPE_CHECKING:
    from tierlink.sim.node import SimNode

__all__ = ["RESPONSE_BYTES", "Exchanges", "Hop", "Work"]

RESPONSE_BYTES = 200  # an answer's tensors and tierlink parameters on the wire

# work(target, done, chain): what the call does on the node it reaches
Work = Callable[["SimNode", Done, Chain], None]


class Hop:
    """One call upstream under its timeout of ``budget_ms``: ``answered(result, server_ms)``
    when it comes back in time, ``failed(None, error)`` when not; ``release`` once,
    however it ends."""

    __slots__ = ("_release", "answered", "budget_ms", "failed", "inner", "over", "timer")

    def __init__(self, budget_ms: float, answered: Callable[[Any, float], None], failed: Done,
                 release: Callable[[], None] | None = None) -> None:
        self.budget_ms, self.answered, self.failed = budget_ms, answered, failed
        self._release = release
        self.inner = Chain()  # what the call does: the wire, the work upstream
        self.timer: asyncio.TimerHandle | None = None
        self.over = False

    def settle(self, result: Any, server_ms: float, error: TierlinkError | None) -> None:
        """The exchange is over (in time)."""
        if self._end():
            return
        if self.timer is not None:
            self.timer.cancel()
        if error is not None:
            self.failed(None, error)
        else:
            self.answered(result, server_ms)

    def timed_out(self, up: str) -> None:
        self.timer = None
        if self._end():
            return
        self.failed(None, UpstreamTimeout(f"{up} did not answer in {self.budget_ms:.1f} ms"))

    def cancel(self) -> None:
        """The caller went away."""
        if self._end():
            return
        if self.timer is not None:
            self.timer.cancel()

    def _end(self) -> bool:
        """True when it was already over; otherwise it is now: what it started upstream
        is cancelled (nothing, when it came back) and it is released."""
        if self.over:
            return True
        self.over = True
        self.inner.cancel()  # also lets go of the last stage (no cycle for the collector)
        if self._release is not None:
            self._release()
        return False


class Exchanges:
    """A node's calls to its upstreams over its simulated links."""

    def __init__(self, links: Mapping[str, SimLink], upstreams: Mapping[str, SimNode],
                 http: HttpCosts, rng: random.Random, clock: Callable[[], float]) -> None:
        self._links, self._upstreams = links, upstreams
        self._http, self._rng, self._clock = http, rng, clock

    def exchange(self, up: str, nbytes: int, work: Work, hop: Hop, chain: Chain) -> None:
        """``nbytes`` to ``up``, ``work`` done there, the answer back; ``hop`` hears the
        result and the time ``up`` spent (ms); it is the stage under way of ``chain``.
        Both ends' HTTP work is drawn once."""
        loop = asyncio.get_running_loop()
        link, target = self._links[up], self._upstreams[up]
        hop.timer = loop.call_later(hop.budget_ms / 1000.0, hop.timed_out, up)
        chain.now = hop
        inner = hop.inner
        hop_s = self._http.hop_s(self._rng)
        clock = self._clock

        def arrived() -> None:
            if not target.alive:  # a reachable host whose process is gone: refused at once
                error = UpstreamUnavailable(f"{up}: connection refused")
                link.reply(0, lambda: hop.settle(None, 0.0, error), inner)
                return
            began, life = clock(), target.incarnation

            def answered(result: Any, error: TierlinkError | None) -> None:
                if target.incarnation != life:  # it crashed holding the request: reset
                    hop.settle(None, 0.0, UpstreamUnavailable(f"{up}: connection reset"))
                elif error is not None:
                    link.reply(RESPONSE_BYTES, lambda: hop.settle(None, 0.0, error), inner)
                else:
                    server_ms = (clock() - began) * 1000.0
                    link.reply(RESPONSE_BYTES, lambda: hop.settle(result, server_ms, None),
                               inner, hop_s / 2)  # and through both HTTP stacks

            try:
                work(target, answered, inner)
            except TierlinkError as exc:
                answered(None, exc)

        if hop_s:  # encoding, the request's HTTP stack
            inner.now = loop.call_later(hop_s / 2, link.send, nbytes + RESPONSE_BYTES, arrived,
                                        inner)
        else:
            link.send(nbytes + RESPONSE_BYTES, arrived, inner)
