"""Circuit breakers toward upstream nodes, so a dead or failing node is skipped at once instead
of costing every request a timeout.

One :class:`CircuitBreaker` per upstream node; a :class:`BreakerBoard` holds them by node id.
The dispatcher asks ``allow()`` before each call and reports the outcome with
``record_success()`` / ``record_failure(kind)``; the node builds ``NodeView.healthy`` from
``board.healthy(node_id)`` before a policy sees the cluster.

States::

    closed ──(failure_threshold consecutive failures, or one "connect" failure)──> open
    open ──(cooldown elapsed, next allow() grants ONE probe)──> half_open
    half_open ──(probe succeeds)──> closed        cooldown back to cooldown_s
    half_open ──(probe fails)──> open             cooldown doubled, up to max_cooldown_s

While half-open only the probe is let through. A probe whose outcome is never reported (its
caller was cancelled) is presumed lost after ``probe_timeout_s``, and the next ``allow()``
grants a new one, so a breaker can never wedge half-open.

Failure kinds are free strings; the dispatcher uses ``"connect"`` (refused / reset: the process
is not there), ``"timeout"`` and ``"error"``. Kinds in ``BreakerSettings.connect_kinds`` open the
breaker at once when ``open_on_connect_error`` is set.

Not thread-safe: use from the event-loop thread (the dispatcher's upstream calls are async).
Time comes from the injected ``clock`` (seconds, monotonic).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tierlink.errors import ConfigError

__all__ = ["BreakerBoard", "BreakerSettings", "BreakerState", "CircuitBreaker"]

log = logging.getLogger(__name__)

BreakerState = Literal["closed", "open", "half_open"]

#: ``on_transition(old, new)`` of one breaker.
TransitionHook = Callable[[BreakerState, BreakerState], None]
#: ``on_transition(node_id, old, new)`` of a board.
BoardTransitionHook = Callable[[str, BreakerState, BreakerState], None]


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """Shared by every breaker of a board. Validated here, once."""

    failure_threshold: int = 3
    cooldown_s: float = 2.0
    max_cooldown_s: float = 30.0
    open_on_connect_error: bool = True
    connect_kinds: frozenset[str] = frozenset({"connect"})
    probe_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ConfigError(
                f"breaker.failure_threshold must be >= 1, got {self.failure_threshold}"
            )
        for name in ("cooldown_s", "max_cooldown_s", "probe_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"breaker.{name} must be a finite number > 0, got {value}")
        if self.max_cooldown_s < self.cooldown_s:
            raise ConfigError(
                f"breaker.max_cooldown_s ({self.max_cooldown_s}) must be >= cooldown_s "
                f"({self.cooldown_s})"
            )


class CircuitBreaker:
    """The breaker of one upstream node. See the module docstring for the state machine.

    ``state`` is the state after the last transition: an open breaker whose cooldown has
    elapsed still reads ``"open"`` until ``allow()`` grants the probe; ``healthy()`` and
    ``retry_after_s()`` already account for the elapsed cooldown.
    """

    def __init__(
        self,
        settings: BreakerSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_transition: TransitionHook | None = None,
    ) -> None:
        self._settings = settings if settings is not None else BreakerSettings()
        self._clock = clock
        self._on_transition = on_transition
        self._state: BreakerState = "closed"
        self._failures = 0  # consecutive, while closed
        self._cooldown_s = self._settings.cooldown_s
        self._opened_at = 0.0
        self._probe_started = 0.0

    @property
    def state(self) -> BreakerState:
        return self._state

    @property
    def cooldown_s(self) -> float:
        """The cooldown of the current (or next) open period."""
        return self._cooldown_s

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def allow(self) -> bool:
        """May a call go to this upstream now? In ``open`` past its cooldown this grants the
        single probe (and moves to ``half_open``); the caller MUST then report the outcome."""
        if self._state == "closed":
            return True
        now = self._clock()
        if self._state == "open":
            if now < self._opened_at + self._cooldown_s:
                return False
            self._probe_started = now
            self._transition("half_open")
            return True
        if now - self._probe_started < self._settings.probe_timeout_s:
            return False  # the probe is still out
        self._probe_started = now  # the earlier probe was lost: let another through
        return True

    def record_success(self) -> None:
        """A call succeeded. Closes a half-open breaker. While open, a success is the late
        answer of a call let through before it opened, and changes nothing."""
        if self._state == "half_open":
            self._cooldown_s = self._settings.cooldown_s
            self._failures = 0
            self._transition("closed")
        elif self._state == "closed":
            self._failures = 0

    def record_failure(self, kind: str = "error") -> None:
        """A call failed. ``kind`` in ``connect_kinds`` opens a closed breaker at once (if
        ``open_on_connect_error``); a failed probe re-opens with a doubled cooldown. While open,
        a late failure changes nothing (it must not stretch the cooldown)."""
        if self._state == "half_open":
            self._cooldown_s = min(self._cooldown_s * 2.0, self._settings.max_cooldown_s)
            self._open()
        elif self._state == "closed":
            self._failures += 1
            settings = self._settings
            connect = settings.open_on_connect_error and kind in settings.connect_kinds
            if connect or self._failures >= settings.failure_threshold:
                self._open()

    def healthy(self, now: float | None = None) -> bool:
        """False only while open and not yet due for a probe."""
        if self._state != "open":
            return True
        now = self._clock() if now is None else now
        return now >= self._opened_at + self._cooldown_s

    def retry_after_s(self, now: float | None = None) -> float:
        """Seconds until ``allow()`` may return True again (0 when it may now). Suitable for
        a Retry-After answer."""
        if self._state == "closed":
            return 0.0
        now = self._clock() if now is None else now
        if self._state == "open":
            return max(0.0, self._opened_at + self._cooldown_s - now)
        return max(0.0, self._probe_started + self._settings.probe_timeout_s - now)

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._failures = 0
        self._transition("open")

    def _transition(self, new: BreakerState) -> None:
        old, self._state = self._state, new
        if self._on_transition is not None and old != new:
            try:
                self._on_transition(old, new)
            except Exception:
                log.exception("breaker transition hook failed (%s -> %s); ignored", old, new)


class BreakerBoard:
    """Breakers by upstream node id, created on first use with shared settings.

    ``on_transition(node_id, old, new)`` is called on every state change (metrics, logs).
    """

    def __init__(
        self,
        settings: BreakerSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_transition: BoardTransitionHook | None = None,
    ) -> None:
        self._settings = settings if settings is not None else BreakerSettings()
        self._clock = clock
        self._on_transition = on_transition
        self._breakers: dict[str, CircuitBreaker] = {}

    def breaker(self, node_id: str) -> CircuitBreaker:
        """The breaker of ``node_id``, created closed if it has none yet."""
        found = self._breakers.get(node_id)
        if found is None:
            found = CircuitBreaker(
                self._settings, clock=self._clock, on_transition=self._hook_for(node_id)
            )
            self._breakers[node_id] = found
        return found

    def allow(self, node_id: str) -> bool:
        return self.breaker(node_id).allow()

    def record_success(self, node_id: str) -> None:
        self.breaker(node_id).record_success()

    def record_failure(self, node_id: str, kind: str = "error") -> None:
        self.breaker(node_id).record_failure(kind)

    def healthy(self, node_id: str) -> bool:
        """False only while ``node_id``'s breaker is open and not yet due for a probe.
        A node never called is healthy (no breaker is created for asking)."""
        found = self._breakers.get(node_id)
        return True if found is None else found.healthy()

    def retry_after_s(self, node_id: str) -> float:
        found = self._breakers.get(node_id)
        return 0.0 if found is None else found.retry_after_s()

    def states(self) -> dict[str, BreakerState]:
        """State of every breaker created so far, by node id."""
        return {node_id: b.state for node_id, b in self._breakers.items()}

    def _hook_for(self, node_id: str) -> TransitionHook | None:
        hook = self._on_transition
        if hook is None:
            return None

        def forward(old: BreakerState, new: BreakerState) -> None:
            hook(node_id, old, new)

        return forward


class DispatchBreakers:
    """Adapts a breaker board to the dispatcher's small protocol (``allow`` / ``success`` /
    ``failure``); the node and the simulator both use it."""

    def __init__(self, board: BreakerBoard) -> None:
        self._board = board

    def allow(self, node_id: str) -> bool:
        return self._board.allow(node_id)

    def success(self, node_id: str) -> None:
        self._board.record_success(node_id)

    def failure(self, node_id: str, kind: str) -> None:
        # A refused/reset connection means the node is gone: open at once (breaker "connect").
        self._board.record_failure(node_id, "connect" if kind == "unavailable" else kind)
