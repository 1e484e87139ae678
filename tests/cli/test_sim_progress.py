"""`tierlink sim` shows each run as a phase of its reporter (its requests answered so far),
and a phase with a heartbeat while runs spread over other processes are out."""

import io

import pytest

from tierlink.cli.sim import _per_run
from tierlink.core.progress import Reporter
from tierlink.sim.run import Spread


def lines_reporter() -> tuple[Reporter, io.StringIO]:
    stream = io.StringIO()
    return Reporter(stream, clock=lambda: 0.0, interval_s=1e9, beat_s=None), stream


def test_each_run_in_this_process_is_a_phase_of_its_own() -> None:
    reporter, stream = lines_reporter()
    with _per_run(reporter, 3, Spread()) as done:
        for name in ("tierlink", "cloud_only"):
            for _ in range(3):
                done(name, None)
    assert stream.getvalue().splitlines() == [
        "tierlink: started", "tierlink: done in 0:00",
        "cloud_only: started", "cloud_only: done in 0:00"]


def test_runs_spread_elsewhere_are_waited_for_under_a_phase() -> None:
    reporter, stream = lines_reporter()
    with pytest.raises(KeyboardInterrupt), _per_run(reporter, 3, Spread(workers=4)) as done:
        done("tierlink", None)
        raise KeyboardInterrupt
    assert stream.getvalue().splitlines() == [
        "simulating on 4 processes: started", "tierlink: started",
        "tierlink: failed after 0:00", "simulating on 4 processes: failed after 0:00"]


def test_the_photo_runs_are_named_apart() -> None:
    reporter, stream = lines_reporter()
    with _per_run(reporter, 1, Spread(), " photos") as done:
        done("tierlink", None)
    assert stream.getvalue().splitlines()[0] == "tierlink photos: started"
