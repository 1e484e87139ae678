"""The one progress mechanism of long commands (tierlink.core.progress.Reporter): plain lines on a
stream that is not a terminal (a start line, a progress line at most every interval, a
"still working" line for a phase that reports nothing, a done line), rich bars on a
terminal, nothing when quiet. A fake clock drives every line: no test sleeps."""

from __future__ import annotations

import io
import threading

import pytest

from tierlink.core.progress import Reporter, as_reporter, clock_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines_reporter(clock: FakeClock, stream: io.StringIO | None = None) -> Reporter:
    return Reporter(stream or io.StringIO(), clock=clock, interval_s=10.0, beat_s=None)


def said(reporter: Reporter) -> list[str]:
    stream = reporter.stream
    assert isinstance(stream, io.StringIO)
    return stream.getvalue().splitlines()


def test_a_counted_phase_says_start_progress_at_the_interval_and_done() -> None:
    clock = FakeClock()
    reporter = lines_reporter(clock)
    with reporter.phase("training", total=5000) as phase:
        for step in range(1, 5001):
            clock.now = 100.0 + step / 50  # 50 steps a second: 100 s in all
            phase.advance(status=f"epoch {1 + (step - 1) // 2500}/2")
        phase.finish("test 91.20%")
    lines = said(reporter)
    assert lines[0] == "training: started"
    assert lines[1] == "training: 500/5,000 (10%) 0:10 elapsed, ~1:30 left; epoch 1/2"
    assert lines[2] == "training: 1,000/5,000 (20%) 0:20 elapsed, ~1:20 left; epoch 1/2"
    progress = lines[1:-1]
    assert len(progress) == 10  # one every 10 s of the 100, not one per step
    assert progress[-1].startswith("training: 5,000/5,000 (100%) 1:40 elapsed;")
    assert lines[-1] == "training: done in 1:40; test 91.20%"


def test_no_progress_line_before_the_interval() -> None:
    clock = FakeClock()
    reporter = lines_reporter(clock)
    with reporter.phase("requests", total=600) as phase:
        clock.now += 9.9
        phase.advance(120)
        assert said(reporter) == ["requests: started"]
        clock.now += 0.1
        phase.advance(120)
    assert said(reporter)[1] == "requests: 240/600 (40%) 0:10 elapsed, ~0:15 left"


def test_a_phase_that_reports_nothing_still_says_it_is_working() -> None:
    clock = FakeClock()
    reporter = lines_reporter(clock)
    with reporter.phase("tuning thresholds"):  # one blocking call, no ticks
        clock.now += 10.0
        reporter.tick()  # what its heartbeat thread does
        reporter.tick()  # not due again yet
        clock.now += 31.0
        reporter.tick()
    assert said(reporter) == ["tuning thresholds: started",
                              "tuning thresholds: still working, 0:10 elapsed",
                              "tuning thresholds: still working, 0:41 elapsed",
                              "tuning thresholds: done in 0:41"]


def test_a_stage_is_said_at_once_and_a_raising_block_fails_the_phase() -> None:
    clock = FakeClock()
    reporter = lines_reporter(clock)
    with pytest.raises(RuntimeError), reporter.phase("fmnist-large", total=10) as phase:
        phase.advance(10)
        phase.stage("exporting")
        clock.now += 83.0
        raise RuntimeError("export failed")
    assert said(reporter) == ["fmnist-large: started", "fmnist-large: exporting",
                              "fmnist-large: failed after 1:23"]


def test_say_is_a_plain_line_and_phases_may_overlap() -> None:
    clock = FakeClock()
    reporter = lines_reporter(clock)
    reporter.say("thresholds [0.9175]: tuned")
    outer = reporter.start("simulating on 2 processes")
    with reporter.phase("tierlink", total=4) as phase:
        clock.now += 12.0
        reporter.tick()
        phase.advance(4)
    outer.finish()
    outer.finish()  # idempotent
    assert said(reporter) == ["thresholds [0.9175]: tuned",
                              "simulating on 2 processes: started", "tierlink: started",
                              "simulating on 2 processes: still working, 0:12 elapsed",
                              "tierlink: 0/4 (0%) 0:12 elapsed",
                              "tierlink: done in 0:12", "simulating on 2 processes: done in 0:12"]


def test_the_heartbeat_thread_speaks_for_a_blocking_phase_and_stops_with_it() -> None:
    clock = FakeClock()
    heard = threading.Event()

    class Watched(io.StringIO):
        def write(self, text: str) -> int:
            if "still working" in text:
                heard.set()
            return super().write(text)

    stream = Watched()
    reporter = Reporter(stream, clock=clock, interval_s=10.0, beat_s=0.001)
    with reporter.phase("installing smollm2-135m") as phase:
        assert phase.beat is not None and phase.beat.thread.daemon
        thread = phase.beat.thread
        clock.now += 10.0  # the blocking call has taken 10 s: the thread says so
        assert heard.wait(timeout=10.0)
    assert not thread.is_alive() and phase.beat is None  # joined when the phase ended
    assert stream.getvalue().splitlines()[-1] == "installing smollm2-135m: done in 0:10"


def test_a_counted_phase_has_no_heartbeat_unless_asked() -> None:
    reporter = Reporter(io.StringIO(), clock=FakeClock())
    with reporter.phase("tierlink", total=10) as counted:
        assert counted.beat is None
    with reporter.phase("fmnist-small", total=10, heartbeat=True) as blocking:
        assert blocking.beat is not None
    assert blocking.beat is None


def test_a_terminal_gets_the_interactive_bars() -> None:
    stream = Terminal()
    reporter = Reporter(stream, clock=FakeClock())
    assert reporter.interactive
    with reporter.phase("fmnist-small", total=6) as phase:
        bars = reporter._bars
        assert bars is not None and phase.beat is None  # rich refreshes the bar itself
        phase.advance(6, status="epoch 2/2 loss 0.500")
        (task,) = bars.tasks
        assert (task.completed, task.total) == (6, 6)
        phase.finish("test 91.00%")
        assert task.fields["status"] == "test 91.00%"
    assert reporter._bars is None  # stopped with the last open phase
    text = stream.getvalue()
    assert "fmnist-small" in text and "started" not in text and "\x1b[" in text


def test_quiet_says_nothing() -> None:
    stream = io.StringIO()
    reporter = Reporter(stream, enabled=False)
    with reporter.phase("anything") as phase:
        phase.advance()
        phase.stage("exporting")
        reporter.tick()
    reporter.say("hello")
    assert stream.getvalue() == "" and phase.beat is None


def test_as_reporter_and_clock_text() -> None:
    mine = Reporter.quiet()
    assert as_reporter(mine) is mine
    assert not as_reporter(False).enabled and as_reporter(True).enabled
    assert [clock_text(s) for s in (0, 41, 83, 725, 3723)] == [
        "0:00", "0:41", "1:23", "12:05", "1:02:03"]
