"""Overload in the right order: when a node cannot serve everything in time, batch gives way
first, then interactive, and realtime keeps its deadlines.

The model queue orders jobs by priority, but on a busy node most of a request's time is not
spent there: it is the HTTP handling, the routing and the forwarding, all on one event loop
(and, on a device under a CPU quota, the periods the kernel freezes the process). A request
waits for the loop whatever its class. So the gate measures that wait directly — the event
loop's lag, probed every few milliseconds, which also shows a quota's freezes — and, as
WeChat's DAGOR does with queueing time, moves an admission level: while the loop ran late
for more than ``target_lag_ms`` per 100 ms of a window (the share of time a request arriving
then would wait: a quota's freeze and a long queue count, a lone garbage collection hardly)
the level drops a step, while it stays under 70% of it the level climbs back. The level is continuous in [1, 3]: a class ``p`` (realtime 0, interactive
1, batch 2) is admitted when ``p + 1 <= level``, with probability ``level - p`` when it is
the class at the edge, and shed otherwise; realtime is never shed by the level (its own
deadline check in the scheduler still refuses what cannot be done in time). Nothing is shed
after a window in which fewer than ``min_inflight`` inference requests were ever in the node
at once: then the lag is a request's own work (a device's quota freezing it mid-model), and
refusing the next would win nothing.

A shed request is not refused at once: it waits for the level to admit it for up to
``max_wait_s`` (never past half its deadline), then is refused with ``429`` and a
``Retry-After`` — explicit, cheap (nothing was decoded, planned or run for it), and before
any work that a higher class needs. ``clock`` and ``rng`` are injected; ``observe_lag``
takes the probe's readings, so tests drive the level without a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from tierlink.core.types import Priority
from tierlink.errors import AdmissionRefused
from tierlink.settings.routing import OverloadConfig

STALL_WINDOWS = 5  # windows whose longest stalls are remembered (a second by default)
TOP = 3.0  # every class admitted
FLOOR = 1.0  # realtime only
CALM = 0.7  # a window under this share of the target lets the level climb
JUDGED = "overload_judged"  # request state: the priority ShedEarly already let through


class OverloadGate:
    """The admission level and the waiters (see the module docstring). One per node, on
    its event loop."""

    def __init__(self, config: OverloadConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None,
                 on_shed: Callable[[Priority, str], None] = lambda p, outcome: None) -> None:
        self.config = config or OverloadConfig()
        self._clock, self._rng = clock, rng or random.Random(0)
        self._on_shed = on_shed
        self.level = TOP
        self.lag_ms = 0.0  # ms late per 100 ms over the last window
        self._late_ms, self._window_start = 0.0, clock()
        self._stalls: deque[float] = deque([0.0] * STALL_WINDOWS, maxlen=STALL_WINDOWS)
        self._window_stall = 0.0
        self._changed: asyncio.Event | None = None
        self.inflight = 0  # inference requests in the app now
        self._peak = 0  # the most at once in this window
        self.competing = False  # did requests overlap (min_inflight) in the last window?

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Count an inference request while the app handles it (``min_inflight``)."""
        self.inflight += 1
        self._peak = max(self._peak, self.inflight)
        try:
            yield
        finally:
            self.inflight -= 1

    # -- the level -----------------------------------------------------------------------

    def observe_lag(self, lag_ms: float) -> None:
        """One probe reading; at the end of a window, move the level."""
        self._late_ms += max(lag_ms, 0.0)
        self._window_stall = max(self._window_stall, lag_ms)
        now = self._clock()
        elapsed = now - self._window_start
        if elapsed < self.config.window_s:
            return
        # Milliseconds late per 100 ms: how much of the window requests would have waited.
        self.lag_ms = self._late_ms / (elapsed * 10.0)
        self._late_ms, self._window_start = 0.0, now
        self._stalls.append(self._window_stall)
        self._window_stall = 0.0
        self.competing = self._peak >= self.config.min_inflight
        self._peak = self.inflight
        before = self.level
        if self.lag_ms > self.config.target_lag_ms:
            self.level = max(FLOOR, self.level - self.config.step_down)
        elif self.lag_ms < self.config.target_lag_ms * CALM:
            self.level = min(TOP, self.level + self.config.step_up)
        if self.level > before and self._changed is not None:
            self._changed.set()  # waiters look again

    def stall_ms(self) -> float:
        """How long the loop has lately run late at once: the second longest of the last
        few windows' longest lateness — a stall seen at least twice (a CPU quota's freezes
        on a busy machine, a restarted neighbour's start-up), not a lone one (a garbage
        collection): what an answer about to be returned may still wait."""
        return sorted(self._stalls)[-2]

    def admits(self, priority: Priority) -> bool:
        p = int(priority)
        if p == Priority.REALTIME or p + 1 <= self.level or not self.competing:
            return True
        return p < self.level and self._rng.random() < self.level - p

    async def run(self) -> None:
        """Probe the loop's lag until cancelled: sleep ``probe_ms`` and see how late the
        loop wakes up (a callback queue, or a process frozen by its CPU quota)."""
        if not self.config.enabled:
            return
        period = self.config.probe_ms / 1000.0
        while True:
            start = time.perf_counter()
            await asyncio.sleep(period)
            self.observe_lag((time.perf_counter() - start - period) * 1000.0)

    # -- requests ------------------------------------------------------------------------

    async def admit(self, priority: Priority, deadline_ms: float | None, node_id: str) -> None:
        """Return when ``priority`` may go on; raise :class:`AdmissionRefused` (429, with a
        retry hint) when it was shed for as long as it could wait."""
        if not self.config.enabled or self.admits(priority):
            return
        budget = self.config.max_wait_s
        if deadline_ms is not None and math.isfinite(deadline_ms):
            budget = min(budget, deadline_ms / 2000.0)
        until = self._clock() + budget
        while (left := until - self._clock()) > 0:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                break
            if changed is self._changed:
                self._changed = None  # the next rise sets a fresh one
            if self.admits(priority):
                self._on_shed(priority, "waited")
                return
        self._on_shed(priority, "refused")
        raise self._refusal(priority, node_id)

    def _refusal(self, priority: Priority, node_id: str) -> AdmissionRefused:
        return AdmissionRefused(
            f"{node_id} is overloaded (its event loop ran {self.lag_ms:.1f} ms late per 100 ms, "
            f"over the {self.config.target_lag_ms:g} it tolerates): {priority.label} requests "
            f"give way to more urgent ones now",
            hint=f"retry in {self.config.retry_after_s:g} s, or send it to another node",
            reason="overloaded", priority=priority.label, level=round(self.level, 3),
            lag_ms=round(self.lag_ms, 3), retry_after_s=self.config.retry_after_s)

    def snapshot(self) -> dict[str, Any]:
        return {"level": round(self.level, 3), "lag_ms": round(self.lag_ms, 3),
                "admitting": [p.label for p in Priority if self.level - int(p) > 0.001]}


class ShedEarly:
    """ASGI middleware: an inference request whose ``tierlink-priority`` header names a
    class the gate sheds now is held or refused here, before routing, reading or decoding
    it — the cheapest a refusal gets, which is what leaves the CPU to the urgent ones. A
    request without the hint goes on; the gate runs again on its parameters."""

    def __init__(self, app: Any, gate: OverloadGate, node_id: str,
                 error_body: Callable[[AdmissionRefused], bytes]) -> None:
        self.app, self.gate, self.node_id, self._body = app, gate, node_id, error_body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/infer"):
            await self.app(scope, receive, send)
            return
        hint = _hints(scope.get("headers") or ())
        if hint is not None:
            try:
                await self.gate.admit(hint[0], hint[1], self.node_id)
            except AdmissionRefused as exc:
                await _refuse(send, self._body(exc), exc)
                return
            # Judged once: the route gates it again only if its parameters say otherwise.
            scope.setdefault("state", {})[JUDGED] = hint[0]
        with self.gate.inside():
            await self.app(scope, receive, send)


def _hints(headers: Any) -> tuple[Priority, float | None] | None:
    priority, deadline = None, None
    for name, value in headers:
        if name == b"tierlink-priority":
            priority = value
        elif name == b"tierlink-deadline-ms":
            deadline = value
    if priority is None:
        return None
    try:
        return (Priority.parse(priority.decode("latin-1")),
                None if deadline is None else float(deadline))
    except (ValueError, AttributeError):
        return None  # a malformed hint is ignored: the parameters decide


async def _refuse(send: Any, body: bytes, exc: AdmissionRefused) -> None:
    retry = max(1, math.ceil(float(exc.details.get("retry_after_s", 1.0))))
    await send({"type": "http.response.start", "status": exc.http_status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(retry).encode())]})
    await send({"type": "http.response.body", "body": body})
