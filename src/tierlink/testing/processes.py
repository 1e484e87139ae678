"""Node processes for tests and benchmarks: start one from a spec, wait until it serves,
stop exactly it (terminate, then kill after a grace period) however the caller ends."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tierlink.node.spec import NodeSpec

LOG_TAIL = 3000


@contextmanager
def node_process(spec: NodeSpec, run_dir: Path,
                 timeout_s: float = 180.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Yields the node's URL and process; ``spec.ready_file`` must be set (port 0 is fine)."""
    if not spec.ready_file:
        raise ValueError("node_process needs a spec with a ready_file")
    spec_path = run_dir / f"{spec.node_id}.json"
    spec_path.write_text(spec.to_json())
    log_path = run_dir / f"{spec.node_id}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tierlink.node.main", "--spec",
                                 str(spec_path)], stdout=log, stderr=subprocess.STDOUT)
        try:
            port = _wait_port(Path(spec.ready_file), proc, log_path, timeout_s)
            yield f"http://127.0.0.1:{port}", proc
        finally:
            stop(proc)


def _wait_port(ready: Path, proc: subprocess.Popen[bytes], log_path: Path,
               timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-LOG_TAIL:]
            raise RuntimeError(f"node did not start (see {log_path}):\n{tail}")
        time.sleep(0.1)
    return int(json.loads(ready.read_text())["port"])


def stop(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
