"""Progress of long commands, one mechanism for all of them: :class:`Reporter`.

A command makes one reporter (on stderr) and hands it to the library code doing the work,
which never prints: it opens a :class:`Phase` per step and reports on it::

    with reporter.phase("fmnist-small", total=5000) as phase:
        for batch in batches:
            ...
            phase.advance(status=f"epoch {epoch} loss {loss:.3f}")
        phase.stage("exporting")
        ...
        phase.finish("test 91.20%")

On a terminal each phase is a rich progress bar. Anywhere else (a pipe, a log file, CI) it
is plain lines, so a long run is never silent::

    fmnist-small: started
    fmnist-small: 1,200/5,000 (24%) 0:41 elapsed, ~2:10 left; epoch 2/7 loss 0.412
    fmnist-small: exporting
    fmnist-small: still working, 1:02 elapsed
    fmnist-small: done in 1:23; test 91.20%

A progress line comes at most every ``interval_s`` (10 s), written when the work advances
its phase (training batches, requests answered). A phase whose work blocks without reporting
(``heartbeat=True``, the default for a phase with no total) has a daemon timer thread for
its lifetime, which writes the same line ("still working" when nothing was counted) on the
same interval; :meth:`Reporter.tick` is what that thread calls, so tests drive it by hand
with a fake clock.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

Clock = Callable[[], float]
INTERVAL_S = 10.0  # at most one progress line per phase this often (not on a terminal)
BEAT_S = 1.0  # how often a heartbeat thread looks whether its phase's line is due


def clock_text(seconds: float) -> str:
    """``0:41``, ``12:05``, ``1:02:03``."""
    minutes, secs = divmod(max(0, int(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Phase:
    """One step of a long command as its :class:`Reporter` shows it (made by
    :meth:`Reporter.phase` or :meth:`Reporter.start`). Updated from one thread: the one
    doing the work."""

    def __init__(self, reporter: Reporter, name: str, total: int | None, started: float) -> None:
        self.name = name
        self.total = total
        self.completed = 0
        self.status = ""
        self.started = started
        self.finished = False
        self.last_line = started  # when this phase last wrote a line (not on a terminal)
        self._reporter = reporter
        self.task: Any = None  # its rich task (on a terminal)
        self.beat: _Heartbeat | None = None

    def advance(self, n: int = 1, status: str | None = None) -> None:
        """``n`` more steps done; ``status``: what the work is at (shown beside the count)."""
        self._reporter.update(self, completed=self.completed + n, status=status)

    def update(self, *, completed: int | None = None, total: int | None = None,
               status: str | None = None) -> None:
        """Set the count, the total (once known) or the status."""
        self._reporter.update(self, completed=completed, total=total, status=status)

    def stage(self, text: str) -> None:
        """The work moved on to ``text`` (``"exporting"``): said at once, and kept as the
        status."""
        self._reporter.stage(self, text)

    def finish(self, summary: str = "", failed: bool = False) -> None:
        """End the phase: ``done in <time>; <summary>`` (or ``failed after <time>``).
        Idempotent: :meth:`Reporter.phase` finishes a phase not finished yet."""
        self._reporter.finish(self, summary, failed)


class _Heartbeat:
    """A daemon thread calling ``beat()`` every ``period_s`` until :meth:`stop`."""

    def __init__(self, beat: Callable[[], None], period_s: float, name: str) -> None:
        self._stop = threading.Event()
        self._beat = beat
        self._period_s = period_s
        self.thread = threading.Thread(target=self._run, name=f"progress {name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()


class Reporter:
    """Where a command's phases are shown: rich bars on a terminal, plain lines otherwise,
    nothing when not ``enabled`` (``--json``). ``stream``: default ``sys.stderr`` (read when
    used); ``interactive``: bars or lines (default: whether ``stream`` is a terminal);
    ``clock``, ``interval_s``: when a progress line is due; ``beat_s``: the heartbeat
    threads' period (None: no threads, :meth:`tick` by hand)."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True,
                 interactive: bool | None = None, clock: Clock = time.monotonic,
                 interval_s: float = INTERVAL_S, beat_s: float | None = BEAT_S) -> None:
        self.stream = stream
        self.enabled = enabled
        self.clock = clock
        self.interval_s = interval_s
        self.beat_s = beat_s
        self._interactive = interactive
        self._lock = threading.RLock()
        self._open: list[Phase] = []
        self._bars: Any = None  # a rich Progress while a phase is open on a terminal

    @classmethod
    def quiet(cls) -> Reporter:
        """A reporter that shows nothing."""
        return cls(enabled=False)

    @property
    def out(self) -> TextIO:
        return sys.stderr if self.stream is None else self.stream

    @property
    def interactive(self) -> bool:
        """Whether phases are rich bars (a terminal) rather than lines."""
        if self._interactive is not None:
            return self._interactive
        try:
            return bool(self.out.isatty())
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            return False

    # -- what library code calls -------------------------------------------------------------

    def say(self, message: str) -> None:
        """One message line (dim on a terminal, above the bars)."""
        if not self.enabled:
            return
        with self._lock:
            if not self.interactive:
                self._write(message)
                return
            from rich.console import Console
            from rich.text import Text

            console = self._bars.console if self._bars is not None else Console(
                file=self.out, force_terminal=True)
            console.print(Text(message, style="dim"))

    @contextmanager
    def phase(self, name: str, total: int | None = None, *,
              heartbeat: bool | None = None) -> Iterator[Phase]:
        """A phase for the ``with`` block: started, finished on the way out (``failed``
        when the block raises). ``heartbeat``: a timer thread says "still working" while
        the block does not report (default: when the phase has no total)."""
        phase = self.start(name, total, heartbeat=heartbeat)
        try:
            yield phase
        except BaseException:
            phase.finish(failed=True)
            raise
        phase.finish()

    def start(self, name: str, total: int | None = None, *,
              heartbeat: bool | None = None) -> Phase:
        """Start a phase (its ``finish`` is the caller's: prefer :meth:`phase`)."""
        phase = Phase(self, name, total, self.clock())
        if not self.enabled:
            return phase
        with self._lock:
            self._open.append(phase)
            if self.interactive:
                phase.task = self._bars_now().add_task(name, total=total, status="")
                return phase
            self._write(f"{name}: started")
        beats = total is None if heartbeat is None else heartbeat
        if beats and self.beat_s is not None:
            phase.beat = _Heartbeat(lambda: self._due(phase), self.beat_s, name)
        return phase

    def tick(self) -> None:
        """Write the progress line of every open phase whose line is due (what the
        heartbeat threads do for theirs)."""
        with self._lock:
            for phase in list(self._open):
                self._due(phase)

    # -- what Phase calls ----------------------------------------------------------------------

    def update(self, phase: Phase, *, completed: int | None = None, total: int | None = None,
               status: str | None = None) -> None:
        if not self.enabled or phase.finished:
            return
        with self._lock:
            phase.completed = phase.completed if completed is None else completed
            phase.total = phase.total if total is None else total
            phase.status = phase.status if status is None else status
            if phase.task is not None:
                self._bars.update(phase.task, completed=phase.completed, total=phase.total,
                                  status=phase.status)
            else:
                self._due(phase)

    def stage(self, phase: Phase, text: str) -> None:
        if not self.enabled or phase.finished:
            return
        with self._lock:
            phase.status = text
            if phase.task is not None:
                self._bars.update(phase.task, status=text)
                return
            phase.last_line = self.clock()
            self._write(f"{phase.name}: {text}")

    def finish(self, phase: Phase, summary: str, failed: bool) -> None:
        if not self.enabled or phase.finished:
            phase.finished = True
            return
        phase.finished = True
        if phase.beat is not None:  # outside the lock: its thread may be waiting for it
            phase.beat.stop()
            phase.beat = None
        with self._lock:
            self._open.remove(phase)
            if phase.task is not None:
                self._end_bar(phase, summary, failed)
            else:
                took = clock_text(self.clock() - phase.started)
                end = f"failed after {took}" if failed else f"done in {took}"
                self._write(f"{phase.name}: {end}" + (f"; {summary}" if summary else ""))

    # -- lines ---------------------------------------------------------------------------------

    def _due(self, phase: Phase) -> None:
        """Write ``phase``'s progress line if ``interval_s`` passed since its last line."""
        with self._lock:
            now = self.clock()
            if phase.finished or phase.task is not None \
                    or now - phase.last_line < self.interval_s:
                return
            phase.last_line = now
            self._write(f"{phase.name}: {progress_text(phase, now - phase.started)}")

    def _write(self, line: str) -> None:
        out = self.out
        out.write(line + "\n")
        out.flush()

    # -- bars ----------------------------------------------------------------------------------

    def _bars_now(self) -> Any:
        if self._bars is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bars = Progress(
                TextColumn("{task.description:<14}", style="bold", markup=False), BarColumn(),
                MofNCompleteColumn(), TextColumn("{task.fields[status]}", markup=False),
                TimeElapsedColumn(), TimeRemainingColumn(),
                console=Console(file=self.out, force_terminal=True))
            self._bars.start()
        return self._bars

    def _end_bar(self, phase: Phase, summary: str, failed: bool) -> None:
        bars = self._bars
        status = "failed" if failed else summary or phase.status
        if phase.total is None and not failed:  # a phase of no count: a full bar when done
            bars.update(phase.task, total=1, completed=1, status=status)
        else:
            bars.update(phase.task, status=status)
        bars.stop_task(phase.task)
        if not self._open:  # the bars stay on screen as they ended
            bars.stop()
            self._bars = None


def progress_text(phase: Phase, elapsed: float) -> str:
    """``1,200/5,000 (24%) 0:41 elapsed, ~2:10 left; <status>``, or ``still working, 0:41
    elapsed`` for a phase that counted nothing and has no total."""
    done, total = phase.completed, phase.total
    took = clock_text(elapsed)
    if total:
        text = f"{done:,}/{total:,} ({100 * done // total}%) {took} elapsed"
        if 0 < done < total:
            text += f", ~{clock_text(elapsed * (total - done) / done)} left"
    elif done:
        text = f"{done:,} done, {took} elapsed"
    else:
        text = f"still working, {took} elapsed"
    return text + (f"; {phase.status}" if phase.status else "")


def as_reporter(progress: bool | Reporter) -> Reporter:
    """What library functions taking ``progress`` report to: the reporter given, a new one
    on stderr (``True``), or a quiet one (``False``)."""
    if isinstance(progress, Reporter):
        return progress
    return Reporter() if progress else Reporter.quiet()
