"""Fakes for the uplink tests: a wall clock that tests move, and an upstream behind
``httpx.MockTransport`` that speaks the outbox wire format and dedupes by key."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tierlink.node.uplink import Uplink, UplinkConfig, UplinkMetrics
from tierlink.outbox import wire


class FakeClock:
    def __init__(self, t: float = 1_733_140_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        """The deliverer's backoff: time jumps, the loop gets a turn."""
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)


class FakeUpstream:
    """Receives batches like a node's inbox or the control plane's /v1/results.

    Knobs: ``down`` (connection refused), ``status`` (answer that HTTP status instead),
    ``reject`` (keys answered ``rejected``). Records every request and every applied key."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.down = False
        self.status = 200
        self.reject: set[str] = set()
        self.requests: list[httpx.Request] = []
        self.attempt_times: list[float] = []  # fake-clock time of every request
        self.applied: list[str] = []  # keys, in the order first applied
        self.bodies: list[dict[str, Any]] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.attempt_times.append(self.clock())
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": "busy"})
        body = json.loads(request.content)
        self.bodies.append(body)
        batch = wire.parse_batch(request.content)
        return httpx.Response(200, json={"acks": [self._ack(e) for e in batch.entries]})

    def _ack(self, entry: wire.WireItem | wire.Rejected) -> dict[str, str]:
        if entry.key in self.reject:
            return {"key": entry.key, "status": "rejected", "detail": "malformed"}
        if entry.key in self.applied:
            return {"key": entry.key, "status": "duplicate"}
        self.applied.append(entry.key)
        return {"key": entry.key, "status": "ok"}


def make_uplink(state_dir: Path, upstream: FakeUpstream, *, parent: bool = True,
                control: bool = True, config: UplinkConfig | None = None,
                metrics: UplinkMetrics | None = None,
                headers: dict[str, dict[str, str]] | None = None) -> Uplink:
    import random

    return Uplink("dev-1", state_dir,
                  parent_url="http://edge-1.test:8001/" if parent else None,
                  control_url="http://control.test:7000" if control else None,
                  headers=headers, config=config, metrics=metrics, clock=upstream.clock,
                  sleep=upstream.clock.sleep, rng=random.Random(0),
                  transport=upstream.transport())


async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``predicate`` (real time) until true; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.002)
