"""What a plan's execution asks its runtime to do, and the asyncio runtime that does it.

The dispatcher (``node/dispatcher.py``) decides without doing any I/O: it is a generator
that yields commands and is sent what came of them (sans-IO). A live node carries them out
on asyncio with HTTP (:func:`run_steps`); the simulator carries them out with callbacks on
virtual time (``sim/dispatch.py``) — no task per simulated request. The route is written
once, in the dispatcher.

Commands:

* :class:`Call` — run one placement and wait for its answer; a ``TierlinkError`` it raises
  is thrown back into the generator, any other exception ends the execution.
* :class:`Start` — run a placement without waiting (a hedged race); ``tag`` names it.
* :class:`Await` — wait until a started call finishes (answered with :class:`Finished`) or
  ``timeout_s`` passes (answered with ``None``).
* :class:`Cancel` — the started call ``tag`` is not needed any more.

Started calls still running when an execution ends are cancelled by the runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tierlink.core.types import Outcome, Placement, Request
from tierlink.errors import TierlinkError
from tierlink.telemetry import tracing

__all__ = ["Await", "Call", "Cancel", "Finished", "Inputs", "LocalStep", "RemoteStep",
           "Start", "StepResult", "Steps", "observed", "run_steps", "sent_request"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """One placement's answer: class probabilities and the outcome as seen from there."""

    outputs: dict[str, np.ndarray]
    outcome: Outcome


Inputs = dict[str, np.ndarray]
# local(placement, request, inputs, remaining_ms)
LocalStep = Callable[[Placement, Request, Inputs, float], Awaitable[StepResult]]
# remote(placement, request, inputs, remaining_ms, hop_budget_ms)
RemoteStep = Callable[[Placement, Request, Inputs, float, float], Awaitable[StepResult]]


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``placement`` with ``remaining_ms`` of the deadline left; a remote one's hop may
    take ``budget_ms`` (less than what is left when an answer in hand must still leave).
    ``escalation``: an answer is in hand already, so what goes upstream is optional work
    (:func:`sent_request` marks it)."""

    placement: Placement
    remaining_ms: float
    budget_ms: float
    escalation: bool = False


def sent_request(call: Call, req: Request) -> Request:
    """``req`` as ``call`` sends it upstream: marked as an escalation when an answer is in
    hand here (or was already on its way here)."""
    if call.escalation and not req.escalation:
        return replace(req, escalation=True)
    return req


@dataclass(frozen=True, slots=True)
class Start:
    """``call`` started, not waited for. ``hedge_of``: set when it hedges that placement,
    sent ``after_ms`` after it."""

    tag: int
    call: Call
    hedge_of: Placement | None = None
    after_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Await:
    """Wait for the next started call to finish, at most ``timeout_s`` (None: until one does)."""

    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class Cancel:
    tag: int


@dataclass(frozen=True, slots=True)
class Finished:
    """A started call is over: its answer, or the ``TierlinkError`` it failed with."""

    tag: int
    result: StepResult | None
    error: TierlinkError | None


Command = Call | Start | Await | Cancel
Steps = Generator[Command, Any, StepResult]


def observed(steps: Steps, t0: float, clock: Callable[[], float],
             observe: Callable[[StepResult | None, float], None]) -> Steps:
    """``steps`` with the outcome (None: it failed) and the latency from ``t0`` handed to
    ``observe`` — how a learning policy and shadow mode hear of each request."""
    try:
        result = yield from steps
    except TierlinkError:
        observe(None, (clock() - t0) * 1000.0)
        raise
    observe(result, (clock() - t0) * 1000.0)
    return result


async def run_steps(steps: Steps, local: LocalStep, remote: RemoteStep, req: Request,
                    inputs: Inputs) -> StepResult:
    """Carry out ``steps`` on asyncio: a call is awaited in place (no task), a started one
    runs as a task; the tasks still running when it ends are cancelled."""
    started: dict[int, asyncio.Future[StepResult]] = {}
    sent: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                command = steps.send(sent) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            sent, error = None, None
            if isinstance(command, Call):
                try:
                    sent = await _call(command, local, remote, req, inputs)
                except Exception as exc:  # noqa: BLE001 -- thrown back into the steps
                    error = exc
            elif isinstance(command, Start):
                started[command.tag] = asyncio.ensure_future(_started(command, local, remote,
                                                                      req, inputs))
            elif isinstance(command, Await):
                try:
                    sent = await _next_finished(started, command.timeout_s)
                except Exception as exc:  # noqa: BLE001 -- a call's own bug: not swallowed
                    error = exc
            elif isinstance(command, Cancel):
                task = started.pop(command.tag)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        for task in started.values():
            if not task.done():
                task.cancel()
        steps.close()


def _call(call: Call, local: LocalStep, remote: RemoteStep, req: Request,
          inputs: Inputs) -> Awaitable[StepResult]:
    placement = call.placement
    if placement.kind == "local":
        return local(placement, req, inputs, call.remaining_ms)
    return remote(placement, sent_request(call, req), inputs, call.remaining_ms,
                  call.budget_ms)


def _started(start: Start, local: LocalStep, remote: RemoteStep, req: Request,
             inputs: Inputs) -> Awaitable[StepResult]:
    call = _call(start.call, local, remote, req, inputs)
    if start.hedge_of is None:
        return call
    return _traced_hedge(call, start.call.placement, start.hedge_of, start.after_ms)


async def _next_finished(started: dict[int, asyncio.Future[StepResult]],
                         timeout_s: float | None) -> Finished | None:
    """The first started call to finish (the lowest tag when several have), or None when
    ``timeout_s`` passed first."""
    done = [tag for tag, task in started.items() if task.done()]
    if not done:
        finished, _ = await asyncio.wait(set(started.values()), timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        if not finished:
            return None
        done = [tag for tag, task in started.items() if task in finished]
    tag = min(done)
    task = started.pop(tag)
    error = task.exception()
    if error is None:
        return Finished(tag, task.result(), None)
    if isinstance(error, TierlinkError):
        return Finished(tag, None, error)
    raise error


async def _traced_hedge(call: Awaitable[StepResult], second: Placement, first: Placement,
                        after_ms: float) -> StepResult:
    """The hedged call under a ``tierlink.hedge`` span (its outcome: answered, or lost when
    the first answer came back and this one was cancelled)."""
    with tracing.stage("tierlink.hedge", {"tierlink.peer": second.node_id,
                                          "tierlink.instead_of": first.node_id,
                                          "tierlink.after_ms": after_ms}) as s:
        try:
            result = await call
        except asyncio.CancelledError:
            tracing.set_attributes(s, {"tierlink.outcome": "lost"})
            raise
        tracing.set_attributes(s, {"tierlink.outcome": "answered"})
        return result
