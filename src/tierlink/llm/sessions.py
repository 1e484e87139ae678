"""Conversations whose KV cache a node keeps between turns (``tierlink.session``), and the
verifier's copy of each drafting device's sequence.

A follow-up turn reuses the longest prefix the cache already holds; a bounded cache that has
dropped positions is reused only when the new prompt extends everything it was fed. Idle
sessions are evicted oldest first when the store is over its count or byte cap.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from tierlink.core.types import Privacy
from tierlink.errors import SessionBusy, SessionNotFound
from tierlink.llm.kvcache import CacheBounds, KVCache
from tierlink.llm.weights import LlamaConfig

_STRICTNESS = {Privacy.ANY: 0, Privacy.SITE: 1, Privacy.LOCAL: 2}


@dataclass
class Session:
    cache: KVCache
    tokens: list[int] = field(default_factory=list)  # everything fed, in order
    last_used: float = 0.0
    busy: bool = False
    turns: int = 0
    # The strictest privacy any of its turns arrived with, and their origin: who may hold
    # the cache (it carries what the prompts said)
    privacy: Privacy = Privacy.ANY
    origin: str | None = None

    def heard(self, privacy: Privacy, origin: str | None) -> None:
        """A turn of ``privacy`` from ``origin`` was fed: the cache is now at least as
        private as it was."""
        if _STRICTNESS[privacy] > _STRICTNESS[self.privacy]:
            self.privacy = privacy
        self.origin = self.origin or origin

    def reuse(self, prompt: list[int]) -> list[int]:
        """Crop the cache to what ``prompt`` shares with it; returns the tokens to feed."""
        if self.cache.evicted:
            if prompt[:len(self.tokens)] == self.tokens and len(prompt) > len(self.tokens):
                return prompt[len(self.tokens):]
            self._reset()
            return prompt
        common = 0
        for a, b in zip(self.tokens, prompt, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt) - 1, self.cache.length)  # feed at least one token
        self.cache.crop(common)
        self.tokens = self.tokens[:common]
        return prompt[common:]

    def _reset(self) -> None:
        self.cache = KVCache(self.cache.config, self.cache.bounds)
        self.tokens = []


class SessionStore:
    def __init__(self, config: LlamaConfig, bounds: CacheBounds | None = None,
                 max_sessions: int = 64, max_bytes: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.bounds = bounds
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.evictions = 0

    def fresh(self) -> Session:
        return Session(KVCache(self.config, self.bounds), last_used=self.clock())

    def open(self, key: str | None) -> Session:
        """The session's state, marked busy (a second concurrent turn gets a 409)."""
        if key is None:
            return self.fresh()
        session = self._sessions.get(key)
        if session is None:
            session = self.fresh()
            self._sessions[key] = session
        elif session.busy:
            raise SessionBusy(f"session {key!r} is answering another turn")
        self._sessions.move_to_end(key)
        session.busy = True
        session.last_used = self.clock()
        self._evict()
        return session

    def close(self, key: str | None, session: Session) -> None:
        session.busy = False
        session.turns += 1
        session.last_used = self.clock()
        if key is not None:
            self._evict()

    def get(self, key: str) -> Session | None:
        """The session held under ``key`` (busy or not), without touching it."""
        return self._sessions.get(key)

    def take(self, key: str) -> Session:
        """An existing idle session, marked busy (to be read whole: :meth:`close` it)."""
        session = self._sessions.get(key)
        if session is None:
            raise SessionNotFound(f"no conversation {key!r} is held here")
        if session.busy:
            raise SessionBusy(f"session {key!r} is answering another turn")
        session.busy = True
        return session

    def untake(self, session: Session) -> None:
        """A session :meth:`take` marked busy was read, not fed: idle again as it was."""
        session.busy = False

    def put(self, key: str, session: Session) -> None:
        """Hold ``session`` under ``key`` (one moved here), replacing an idle one."""
        held = self._sessions.get(key)
        if held is not None and held.busy:
            raise SessionBusy(f"session {key!r} is answering another turn")
        session.last_used = self.clock()
        self._sessions[key] = session
        self._sessions.move_to_end(key)
        self._evict()

    def recent(self, within_s: float) -> int:
        """Sessions used within the last ``within_s`` seconds (busy ones included)."""
        now = self.clock()
        return sum(1 for s in self._sessions.values() if s.busy or now - s.last_used <= within_s)

    def drop(self, key: str) -> bool:
        """Forget a session now (its owner is done); a busy one stays until its turn ends."""
        session = self._sessions.get(key)
        if session is None or session.busy:
            return False
        del self._sessions[key]
        return True

    def bytes_in_use(self) -> int:
        return sum(s.cache.bytes_reserved() for s in self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, key: str) -> bool:
        return key in self._sessions

    def _evict(self) -> None:
        def over() -> bool:
            if len(self._sessions) > self.max_sessions:
                return True
            return self.max_bytes is not None and self.bytes_in_use() > self.max_bytes
        for key in list(self._sessions):
            if not over():
                break
            if not self._sessions[key].busy:
                del self._sessions[key]
                self.evictions += 1
