"""What a dispatcher under test reports to (hedges kept) and its breakers (a real board)."""

from __future__ import annotations

import time
from collections.abc import Callable

from tierlink.node.breaker import BreakerBoard


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
