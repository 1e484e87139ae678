"""What a dispatcher under test reports to (hedges kept), its breakers (a real board) and a
live remote step with a latency per node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection

import numpy as np

from tierlink.core.types import Outcome, Placement, Request, Tier
from tierlink.errors import UpstreamUnavailable
from tierlink.node.breaker import BreakerBoard
from tierlink.node.steps import Inputs, RemoteStep, StepResult


class Obs:
    def __init__(self) -> None:
        self.hedges: list[tuple[str, str]] = []

    def escalated(self, model: str) -> None: ...
    def fell_back(self, node_id: str, reason: str) -> None: ...
    def retried(self, node_id: str) -> None: ...

    def hedged(self, node_id: str, outcome: str) -> None:
        self.hedges.append((node_id, outcome))


class Boards:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.board = BreakerBoard(clock=clock)

    def allow(self, n: str) -> bool:
        return self.board.allow(n)

    def success(self, n: str) -> None:
        self.board.record_success(n)

    def failure(self, n: str, kind: str) -> None:
        self.board.record_failure(n, "connect")


def answer(node_id: str, tier: Tier = Tier.EDGE) -> StepResult:
    return StepResult({"label": np.array([1])}, Outcome(node_id, tier, "m", (node_id,), 0.99))


def timed_remote(latency_ms: dict[str, float], fail: Collection[str],
                 cancelled: list[str]) -> RemoteStep:
    """A live remote step that answers after each node's latency (``fail``: an error
    instead), noting the calls cancelled while they ran."""

    async def remote(p: Placement, req: Request, inputs: Inputs, remaining: float,
                     hop_budget: float) -> StepResult:
        try:
            await asyncio.sleep(latency_ms[p.node_id] / 1000)
        except asyncio.CancelledError:
            cancelled.append(p.node_id)
            raise
        if p.node_id in fail:
            raise UpstreamUnavailable(f"{p.node_id} down")
        return answer(p.node_id, p.tier)

    return remote
