"""kill -9 of the sender, mid-run and between the receiver applying and the sender acking:
every item the sender reported as accepted is applied exactly once, in order per destination.

Real processes: a receiver (HTTP on loopback, inbox + effect in one SQLite transaction) and
three successive senders on the same outbox file (see ``outbox_procs.py``).
"""

from __future__ import annotations

import queue
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

PROCS = Path(__file__).with_name("outbox_procs.py")


class Proc:
    """A started process whose stdout lines are read by a thread into a queue."""

    def __init__(self, *args: str) -> None:
        self.popen = subprocess.Popen([sys.executable, str(PROCS), *args],
                                      stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, predicate: object, timeout_s: float = 15.0) -> str:
        """The first line (from now) that satisfies ``predicate``."""
        while True:
            line = self.lines.get(timeout=timeout_s)
            if line is None:
                raise AssertionError(f"process ended (rc {self.popen.wait()}) before the line")
            self.seen.append(line)
            if predicate(line):  # type: ignore[operator]
                return line

    def kill9(self) -> list[str]:
        """SIGKILL, then every complete line it printed."""
        self.popen.kill()
        self.popen.wait(10)
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        return self.seen


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:  # only the processes this test started
        if p.popen.poll() is None:
            p.popen.kill()
        p.popen.wait(10)
        if p.popen.stdout is not None:
            p.popen.stdout.close()


def _keys(lines: list[str], tag: str) -> list[tuple[str, str]]:
    """(destination, key) of the complete ``tag`` lines (a kill may cut the last line)."""
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == tag and len(parts[2]) == 32:
            out.append((parts[1], parts[2]))
    return out


def test_kill9_of_the_sender_loses_and_duplicates_nothing(tmp_path: Path,
                                                          procs: list[Proc]) -> None:
    outbox_db, receiver_db = str(tmp_path / "outbox.db"), str(tmp_path / "receiver.db")
    receiver = Proc("receiver", receiver_db)
    procs.append(receiver)
    url = f"http://127.0.0.1:{receiver.wait_for(lambda s: s.startswith('PORT')).split()[1]}"
    control = httpx.Client(base_url=url, timeout=25)

    # 1. kill -9 mid-run: enqueueing and delivering at the same time.
    first = Proc("sender", outbox_db, url, "400")
    procs.append(first)
    for _ in range(80):
        first.wait_for(lambda s: s.startswith("ACCEPTED"))
    lines = first.kill9()

    # 2. kill -9 between the receiver applying a batch and the sender acking it.
    control.post("/stall")
    second = Proc("sender", outbox_db, url, "20")
    procs.append(second)
    assert control.get("/stalled").json() == {"stalled": True}
    lines += second.kill9()
    control.post("/release")

    # 3. restart on the same file and drain.
    third = Proc("sender", outbox_db, url, "30", "--drain")
    procs.append(third)
    third.wait_for(lambda s: s == "DRAINED", timeout_s=20)
    assert third.popen.wait(10) == 0
    lines += third.seen

    tried, accepted = _keys(lines, "TRY"), _keys(lines, "ACCEPTED")
    db = sqlite3.connect(receiver_db)
    effects = db.execute("SELECT destination, key FROM effects ORDER BY seq").fetchall()
    duplicates = db.execute("SELECT COUNT(*) FROM duplicates").fetchone()[0]

    applied = [(d, k) for d, k in effects]
    assert len(applied) == len(set(applied)), "an item was applied twice"
    assert set(accepted) <= set(applied), "an accepted item was lost"
    assert set(applied) <= set(tried), "an item nobody enqueued was applied"
    for destination in ("edge-1", "edge-2"):  # delivery order = enqueue order
        order = [k for d, k in tried if d == destination]
        got = [k for d, k in applied if d == destination]
        assert got == [k for k in order if k in set(got)]
    assert duplicates >= 1, "the stalled batch was not redelivered (the window was missed)"
    assert len(accepted) >= 80 + 1 + 30
