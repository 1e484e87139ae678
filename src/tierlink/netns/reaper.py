"""Removes a fleet's processes, namespaces and cgroups when `tierlink up` dies without
stopping them (kill -9, an OOM kill, a crash).

``python -m tierlink.netns.reaper --watch PID --state FILE``: started by the launcher in a
session of its own; every half second it checks that ``PID`` (the launcher) lives. While
it does, nothing happens; when the launcher stops the fleet it removes ``FILE`` and the
reaper exits. When ``PID`` dies with ``FILE`` still there, the reaper kills every process
``FILE`` lists (each leads a session of its own: the whole group), removes the namespaces,
veth pairs and bridge of the plan it holds and the cgroups it lists, then removes ``FILE``.

``FILE`` (JSON, rewritten atomically by the launcher at each change):
``{"plan": FabricPlan, "pids": [...], "cgroups": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from tierlink.netns.fabric import FabricPlan, destroy_plan


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def write_state(path: Path, plan: FabricPlan, pids: list[int], cgroups: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"plan": plan.to_dict(), "pids": pids, "cgroups": cgroups}))
    os.replace(tmp, path)


def reap(state: dict[str, Any], grace_s: float = 3.0) -> list[str]:
    """Kill the listed processes (groups), then remove the fabric and the cgroups; what
    could not be removed."""
    pids = [int(p) for p in state.get("pids", [])]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + grace_s
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
    left = destroy_plan(FabricPlan.from_dict(state["plan"]))
    for group in state.get("cgroups", []):
        try:
            Path(group).rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            left.append(f"rmdir {group}: {exc}")
    return left


def watch(launcher: int, state_file: Path, interval_s: float = 0.5) -> int:
    while state_file.exists():
        if not alive(launcher):
            try:
                state = json.loads(state_file.read_text())
            except (OSError, ValueError):
                return 1
            left = reap(state)
            state_file.unlink(missing_ok=True)
            print(f"tierlink up ({launcher}) died; removed fabric {state['plan']['tag']}"
                  + (f"; could not remove: {left}" if left else ""), flush=True)
            return 0
        time.sleep(interval_s)
    return 0  # the launcher stopped the fleet itself


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierlink.netns.reaper")
    parser.add_argument("--watch", type=int, required=True, help="the launcher's pid")
    parser.add_argument("--state", type=Path, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for `tierlink up`
    return watch(args.watch, args.state)


if __name__ == "__main__":
    raise SystemExit(main())
