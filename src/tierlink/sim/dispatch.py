"""The dispatcher's steps carried out on virtual time, with callbacks: no task, no future
and no coroutine per simulated request.

The live node runs the same steps (``node/dispatcher.py``: escalation, fallback, retries,
hedges) on asyncio (``node/steps.run_steps``); here a :class:`SimRun` sends each command to
the simulated node's step runner and resumes the steps from the callback that brings its
answer. A simulated operation of several stages (a hop: encode, the wire, the request
upstream, the wire back) is a :class:`Chain`: what is under way now, cancelled with it — as
cancelling a coroutine cancels whatever it awaits.

The rule every simulated step keeps: it raises a ``TierlinkError`` at once, or it calls
back later (from a callback of the loop), never from inside the call that started it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from tierlink.core.types import Request
from tierlink.errors import TierlinkError
from tierlink.node.steps import Await, Call, Cancel, Finished, Inputs, Start, StepResult, Steps

__all__ = ["Cancellable", "Chain", "Done", "SimRun", "StepRunner"]

# (answer, error): exactly one of them is set
Done = Callable[[Any, TierlinkError | None], None]


class Cancellable(Protocol):
    def cancel(self) -> Any: ...


class Chain:
    """One simulated operation: the stage under way (a timer, a queued job, a request
    upstream), cancelled with the whole."""

    __slots__ = ("cancelled", "now")

    def __init__(self) -> None:
        self.now: Cancellable | None = None
        self.cancelled = False

    def cancel(self) -> None:
        """Stop the stage under way; a finished one is only let go of."""
        if not self.cancelled:
            self.cancelled = True
            now, self.now = self.now, None
            if now is not None:
                now.cancel()


class StepRunner(Protocol):
    """A simulated node's steps: run ``call`` for ``req``; raise at once or call ``done``
    later, keeping what is under way in ``chain``."""

    def run_step(self, call: Call, req: Request, inputs: Inputs, done: Done,
                 chain: Chain) -> None: ...


class SimRun:
    """One request's steps on a simulated node, from the first command to the answer."""

    __slots__ = ("_done", "_early", "_inputs", "_ready", "_req", "_runner", "_started",
                 "_steps", "_sync", "_timer", "_waiting", "current")

    def __init__(self, runner: StepRunner, steps: Steps, req: Request, inputs: Inputs,
                 done: Done) -> None:
        self._runner, self._steps, self._req, self._inputs = runner, steps, req, inputs
        self._done = done
        self.current: Chain | None = None  # the call waited for
        self._started: dict[int, Chain] = {}
        self._ready: list[Finished] = []  # started calls over, not yet awaited
        self._waiting = False
        self._timer: asyncio.TimerHandle | None = None
        self._sync = False
        self._early: TierlinkError | None = None

    def start(self) -> None:
        """Run the steps up to their first wait; raise what they fail with before it."""
        self._sync = True
        self._advance(None, None)
        self._sync = False
        early, self._early = self._early, None
        if early is not None:
            raise early

    def cancel(self) -> None:
        """The caller went away: nothing more runs, nothing is answered."""
        self._steps.close()
        if self.current is not None:
            self.current.cancel()
        self._close()

    def _advance(self, sent: Any, error: TierlinkError | None) -> None:
        steps = self._steps
        while True:
            try:
                command = steps.send(sent) if error is None else steps.throw(error)
            except StopIteration as stop:
                self._end(stop.value, None)
                return
            except TierlinkError as exc:
                self._end(None, exc)
                return
            sent, error = None, None
            if isinstance(command, Call):
                chain = Chain()
                try:
                    self._runner.run_step(command, self._req, self._inputs, self._called, chain)
                except TierlinkError as exc:
                    error = exc
                    continue
                self.current = chain
                return
            if isinstance(command, Await):
                if self._ready:
                    sent = self._ready.pop(0)
                    continue
                self._waiting = True
                if command.timeout_s is not None:
                    self._timer = asyncio.get_running_loop().call_later(
                        command.timeout_s, self._timed_out)
                return
            if isinstance(command, Start):
                self._begin(command)
            elif isinstance(command, Cancel):
                started = self._started.pop(command.tag, None)
                if started is not None:
                    started.cancel()

    def _begin(self, start: Start) -> None:
        chain = Chain()
        tag = start.tag

        def finished(result: StepResult | None, error: TierlinkError | None) -> None:
            self._finished(Finished(tag, result, error))

        try:
            self._runner.run_step(start.call, self._req, self._inputs, finished, chain)
        except TierlinkError as exc:
            self._ready.append(Finished(tag, None, exc))
            return
        self._started[tag] = chain

    def _called(self, result: StepResult | None, error: TierlinkError | None) -> None:
        self.current = None
        self._advance(result, error)

    def _finished(self, finished: Finished) -> None:
        self._started.pop(finished.tag, None)
        if not self._waiting:
            self._ready.append(finished)
            return
        self._waiting = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._advance(finished, None)

    def _timed_out(self) -> None:
        self._waiting, self._timer = False, None
        self._advance(None, None)

    def _end(self, result: StepResult | None, error: TierlinkError | None) -> None:
        self._close()
        if self._sync:
            if error is None:
                raise RuntimeError("a simulated step answered inside the call that started it")
            self._early = error
            return
        self._done(result, error)

    def _close(self) -> None:
        """Calls still running are not needed any more (as the live runtime cancels them)."""
        for chain in self._started.values():
            chain.cancel()
        self._started.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
