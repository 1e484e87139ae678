"""Which node holds each conversation's cache: a follow-up turn (``tierlink.session``) is
placed there while that node is healthy, so its prompt's cached prefix is not computed
again. Bounded (least recently used first out) and forgetful (``ttl_s`` after the last
turn), with the clock injected."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class SessionAffinity:
    def __init__(self, capacity: int = 4096, ttl_s: float = 1800.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._clock = clock
        self._where: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def node_of(self, session: str | None) -> str | None:
        if session is None:
            return None
        hit = self._where.get(session)
        if hit is None:
            return None
        if self._clock() - hit[1] > self.ttl_s:
            del self._where[session]
            return None
        return hit[0]

    def served(self, session: str | None, node_id: str) -> None:
        if session is None:
            return
        self._where[session] = (node_id, self._clock())
        self._where.move_to_end(session)
        while len(self._where) > self.capacity:
            self._where.popitem(last=False)

    def __len__(self) -> int:
        return len(self._where)
