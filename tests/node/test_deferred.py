"""A node's asynchronous desk (``node/deferred.py``): a request routed at once when it
should not wait; held durably (surviving a restart) when it should, run when its time comes
with what is left of its deadline, its result queued — or, if nothing can place it then,
its error queued: never dropped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tierlink.core.types import Outcome, Tier
from tierlink.errors import NoFeasiblePlacement, TierlinkError
from tierlink.node import protocol
from tierlink.node.deferred import AsyncDesk, DeferredStore
from tierlink.routing.deferral import Deferral

X = {"input": np.arange(4, dtype=np.float32).reshape(1, 4)}
PARAMS = {protocol.DEADLINE: 6 * 3600 * 1000.0, "tierlink.async": True}


class Results:
    """The outbox side: what was queued as results, and as errors."""

    def __init__(self) -> None:
        self.accepted: list[tuple[str, str]] = []
        self.errors: list[tuple[str, str]] = []
        self.uplink = type("U", (), {"node_id": "dev-1"})()

    async def accept(self, request_id: str, task: str, outputs: Any, outcome: Outcome,
                     server_ms: float) -> dict[str, Any]:
        self.accepted.append((request_id, task))
        return {"request_id": request_id, "status": "accepted"}

    async def refused(self, request_id: str, task: str, error: TierlinkError) -> None:
        self.errors.append((request_id, error.code))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def desk(tmp_path: Path, wait_s: float, fail: bool = False
         ) -> tuple[AsyncDesk, Results, Clock, list[dict[str, Any]]]:
    routed: list[dict[str, Any]] = []
    results, clock = Results(), Clock()

    async def route(task: str, inputs: dict[str, np.ndarray], params: dict[str, Any],
                    request_id: str) -> tuple[dict[str, np.ndarray], Outcome, float]:
        routed.append({"inputs": inputs, **params})
        if fail:
            raise NoFeasiblePlacement("dev-1: nothing serves it now")
        return {"label": np.array([1])}, Outcome("dev-1", Tier.DEVICE, "m", ("dev-1",), 0.9), 1.0

    def decide(task: str, inputs: Any, params: Any, request_id: str) -> Deferral:
        return Deferral(wait_s, 1.0, 2.0)

    store = DeferredStore(tmp_path / "deferred.sqlite")
    return AsyncDesk(results, store, route, decide, clock), results, clock, routed  # type: ignore[arg-type]


def test_work_that_should_not_wait_is_routed_at_once(tmp_path: Path) -> None:
    d, results, _, routed = desk(tmp_path, 0.0)
    body = asyncio.run(d.accept("fmnist", X, dict(PARAMS), "a"))
    assert body["status"] == "accepted" and results.accepted == [("a", "fmnist")]
    assert len(routed) == 1 and len(d.store) == 0


def test_held_work_runs_when_its_time_comes_with_what_is_left_of_its_deadline(
        tmp_path: Path) -> None:
    d, results, clock, routed = desk(tmp_path, 3600.0)
    body = asyncio.run(d.accept("fmnist", X, dict(PARAMS), "b"))
    assert body["status"] == "deferred" and body["run_after"] == clock.now + 3600.0
    assert body["result_key"] == "dev-1:b" and body["est_cost_usd"] < body["now_cost_usd"]
    assert routed == [] and len(d.store) == 1
    clock.now += 3599.0
    assert asyncio.run(d.run_due()) == 0
    clock.now += 1.0
    assert asyncio.run(d.run_due()) == 1
    assert results.accepted == [("b", "fmnist")] and len(d.store) == 0
    assert routed[0][protocol.DEADLINE] == pytest.approx(5 * 3600 * 1000.0)
    np.testing.assert_array_equal(routed[0]["inputs"]["input"], X["input"])


def test_held_work_survives_a_restart(tmp_path: Path) -> None:
    d, _, clock, _ = desk(tmp_path, 60.0)
    asyncio.run(d.accept("fmnist", X, dict(PARAMS), "c"))
    d.store.close()
    again, results, clock2, _ = desk(tmp_path, 0.0)
    clock2.now = clock.now + 61.0
    assert asyncio.run(again.run_due()) == 1 and results.accepted == [("c", "fmnist")]


def test_held_work_that_cannot_be_placed_when_it_runs_queues_its_error(
        tmp_path: Path) -> None:
    d, results, clock, _ = desk(tmp_path, 10.0, fail=True)
    asyncio.run(d.accept("fmnist", X, dict(PARAMS), "d"))
    clock.now += 10.0
    asyncio.run(d.run_due())
    assert results.errors == [("d", "no_feasible_placement")] and len(d.store) == 0


def test_held_work_due_together_runs_side_by_side(tmp_path: Path) -> None:
    running, most = 0, 0
    results, clock = Results(), Clock()

    async def route(task: str, inputs: Any, params: Any, request_id: str) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        return {"label": np.array([1])}, Outcome("dev-1", Tier.DEVICE, "m", ("dev-1",), 0.9), 1.0

    d = AsyncDesk(results, DeferredStore(tmp_path / "d.sqlite"), route,  # type: ignore[arg-type]
                  lambda *a: Deferral(5.0, 1.0, 2.0), clock)
    for i in range(40):
        asyncio.run(d.accept("fmnist", X, dict(PARAMS), f"r{i}"))
    clock.now += 10.0
    assert asyncio.run(d.run_due(parallel=8)) == 40
    assert most == 8 and len(results.accepted) == 40 and len(d.store) == 0
