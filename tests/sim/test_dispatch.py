"""The dispatcher's steps on virtual time with callbacks (``sim/dispatch.py``): the same
decisions as the live node's asyncio runtime, cancellation that reaches the call under way,
refusals raised at once, and no task per simulated request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import sim_support as toy
from dispatch_support import Boards, Obs, answer, timed_remote
from tierlink.core.types import Placement, Plan, Request, Tier
from tierlink.errors import Overloaded, TierlinkError, UpstreamUnavailable
from tierlink.node.dispatcher import Dispatcher, RetryBudget
from tierlink.node.hedging import HedgeConfig, Hedger
from tierlink.node.steps import Call, Inputs, StepResult
from tierlink.sim import loop
from tierlink.sim.dispatch import Chain, Done, SimRun
from tierlink.sim.run import run_once
from tierlink.sim.workload import Arrivals, workload

REQ = Request("r", "fmnist", 1000.0, "dev-1")
PLAN = Plan((Placement("remote", "edge-1", Tier.EDGE, est_ms=5.0),
             Placement("remote", "edge-2", Tier.EDGE, est_ms=5.0)), "tierlink")


def _dispatcher(clock: Callable[[], float], budget: float = 1.0,
                live: tuple | None = None) -> tuple[Dispatcher, Obs]:
    obs = Obs()
    hedger = Hedger(HedgeConfig(min_samples=3, budget=budget, min_delay_ms=1.0))
    for _ in range(3):
        hedger.observe("fmnist", "edge-2", 20.0)  # what a normal call takes
    local, remote = live or (None, None)
    return Dispatcher("dev-1", Tier.DEVICE, local, remote, Boards(clock), RetryBudget(0.0),
                      obs, clock, hedger=hedger), obs


class _Timed:
    """A simulated call: answers (or fails) after its latency; its cancellation noted."""

    def __init__(self, node_id: str, cancelled: list[str]) -> None:
        self.node_id, self.cancelled, self.timer = node_id, cancelled, None

    def cancel(self) -> None:
        self.cancelled.append(self.node_id)
        if self.timer is not None:
            self.timer.cancel()


class Runner:
    def __init__(self, latency_ms: dict[str, float], fail: frozenset[str] = frozenset(),
                 refuse: frozenset[str] = frozenset()) -> None:
        self.latency_ms, self.fail, self.refuse = latency_ms, fail, refuse
        self.cancelled: list[str] = []

    def run_step(self, call: Call, req: Request, inputs: Inputs, done: Done,
                 chain: Chain) -> None:
        node_id = call.placement.node_id
        if node_id in self.refuse:
            raise Overloaded(f"{node_id} refused it at once")
        error = UpstreamUnavailable(f"{node_id} down") if node_id in self.fail else None
        timed = _Timed(node_id, self.cancelled)
        timed.timer = asyncio.get_running_loop().call_later(
            self.latency_ms[node_id] / 1000.0, lambda: done(
                None if error else answer(node_id), error))
        chain.now = timed


def _simulated(latency_ms: dict[str, float], fail: frozenset[str] = frozenset(),
               budget: float = 1.0) -> tuple[str, list, list[str]]:
    async def main() -> tuple[str, list, list[str]]:
        clock = asyncio.get_running_loop().time
        d, obs = _dispatcher(clock, budget)
        runner = Runner(latency_ms, fail)
        answer: asyncio.Future[StepResult] = asyncio.get_running_loop().create_future()

        def done(result: StepResult | None, error: TierlinkError | None) -> None:
            answer.set_result(result) if error is None else answer.set_exception(error)

        SimRun(runner, d.steps(PLAN, REQ, {}, clock() + 1.0), REQ, {}, done).start()
        out = await answer
        return out.outcome.served_by, obs.hedges, runner.cancelled

    return loop.run(main)


def _live(latency_ms: dict[str, float], fail: frozenset[str] = frozenset(),
          budget: float = 1.0) -> tuple[str, list, list[str]]:
    cancelled: list[str] = []

    remote = timed_remote(latency_ms, fail, cancelled)

    async def local(p: Placement, req: Request, inputs: Inputs, remaining: float
                    ) -> StepResult:
        raise AssertionError("no local step in these plans")

    d, obs = _dispatcher(time.monotonic, budget, (local, remote))
    out = asyncio.run(d.execute(PLAN, REQ, {}, time.monotonic() + 1.0))
    return out.outcome.served_by, obs.hedges, cancelled


@pytest.mark.parametrize(("latency_ms", "fail", "budget", "expected"), [
    # slow first call: hedged, the hedge wins, the first is cancelled
    ({"edge-1": 400.0, "edge-2": 20.0}, frozenset(), 1.0,
     ("edge-2", [("edge-2", "sent"), ("edge-2", "won")], ["edge-1"])),
    # fast: no hedge
    ({"edge-1": 2.0, "edge-2": 20.0}, frozenset(), 1.0, ("edge-1", [], [])),
    # the first call wins the race, the hedge is cancelled
    ({"edge-1": 45.0, "edge-2": 200.0}, frozenset(), 1.0,
     ("edge-1", [("edge-2", "sent"), ("edge-2", "lost")], ["edge-2"])),
    # a failed hedge leaves the first call to answer
    ({"edge-1": 60.0, "edge-2": 1.0}, frozenset({"edge-2"}), 1.0,
     ("edge-1", [("edge-2", "sent"), ("edge-2", "lost")], [])),
    # no budget: waited on
    ({"edge-1": 60.0, "edge-2": 20.0}, frozenset(), 0.0,
     ("edge-1", [("edge-2", "no_budget")], [])),
])
def test_the_same_steps_decide_the_same_live_and_simulated(latency_ms, fail, budget,
                                                           expected) -> None:
    assert _simulated(latency_ms, fail, budget) == expected
    assert _live(latency_ms, fail, budget) == expected


def test_placements_refused_at_once_fail_the_run_at_once() -> None:
    async def main() -> None:
        clock = asyncio.get_running_loop().time
        d, _ = _dispatcher(clock)
        runner = Runner({}, refuse=frozenset({"edge-1", "edge-2"}))
        run = SimRun(runner, d.steps(PLAN, REQ, {}, clock() + 1.0), REQ, {},
                     lambda r, e: pytest.fail("answered"))
        with pytest.raises(Overloaded, match="failed on every placement"):
            run.start()

    loop.run(main)


def test_cancelling_a_run_cancels_its_call_and_answers_nothing() -> None:
    async def main() -> list[str]:
        clock = asyncio.get_running_loop().time
        d, _ = _dispatcher(clock)
        runner = Runner({"edge-1": 50.0, "edge-2": 50.0})
        answered: list[object] = []
        run = SimRun(runner, d.steps(PLAN, REQ, {}, clock() + 1.0), REQ, {},
                     lambda r, e: answered.append(r or e))
        run.start()
        await asyncio.sleep(0.01)
        run.cancel()
        await asyncio.sleep(0.2)
        assert answered == []
        return runner.cancelled

    assert loop.run(main) == ["edge-1"]


def test_a_step_that_answers_inside_its_own_call_is_a_bug() -> None:
    class Eager(Runner):
        def run_step(self, call: Call, req: Request, inputs: Inputs, done: Done,
                     chain: Chain) -> None:
            done(answer(call.placement.node_id), None)

    async def main() -> None:
        clock = asyncio.get_running_loop().time
        d, _ = _dispatcher(clock)
        run = SimRun(Eager({}), d.steps(PLAN, REQ, {}, clock() + 1.0), REQ, {},
                     lambda r, e: None)
        with pytest.raises(RuntimeError, match="inside the call"):
            run.start()

    loop.run(main)


def test_a_simulation_starts_no_task_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    create_task = loop.VirtualLoop.create_task

    def counted(self: loop.VirtualLoop, coro, **kwargs):  # type: ignore[no-untyped-def]
        started.append(coro)
        return create_task(self, coro, **kwargs)

    monkeypatch.setattr(loop.VirtualLoop, "create_task", counted)
    items = workload(Arrivals("constant", 25.0), 24.0, ["dev-1", "dev-2"], toy.N, seed=5)
    result = run_once(toy.fleet(), toy.views(), toy.outcomes(), items, None, seed=1)
    assert len(result.records) == len(items) == 600
    assert sum(r.answered for r in result.records) > 500
    assert len(started) <= 2  # the run itself (and a battery sampler when batteries run)
