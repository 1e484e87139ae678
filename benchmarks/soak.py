"""A soak: the demo fleet under steady mixed load for ten minutes while a node is killed
(kill -9) and restarted every minute — do memory and open files stay flat, is anything
lost, is every refusal explicit?

    python benchmarks/soak.py --json docs/results/soak.json            # 10 minutes
    python benchmarks/soak.py --minutes 3                               # a shorter look

Load: a third each of realtime (30 ms), interactive (150 ms) and batch (1 s) requests from
the four devices at ``--rate`` per second (the lean client of benchmarks/overload.py).
Every minute one of edge-1, edge-2 and cloud-1 (in turn) is killed and restarted 10 s later
from its state directory; the devices, which take the requests, stay up. Every 5 s the RSS
and open file descriptors of each process are read from /proc. ``rss_growth`` and
``open_files_growth`` compare a process's mean over the last minute with its mean over
the second (the first is warm-up): for a node restarted during the run, its last
incarnation's against its first's at the same age. Lost: a request a live device took and
never answered; unexplained: an answer that is neither a success nor an explicit refusal
(429 / 503 / 504 with its code).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overload as ov

VICTIMS = ("edge-1", "edge-2", "cloud-1")
SAMPLE_S = 5.0
DOWN_S = 10.0


def proc_stats(pid: int) -> tuple[float, int] | None:
    """(RSS in MB, open file descriptors) of ``pid``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            rss_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        return rss_kb / 1024.0, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None


class Sampler(threading.Thread):
    """Reads every process of the fleet every ``SAMPLE_S``: (t, name, pid, rss, fds)."""

    def __init__(self, fleet: Any, start: float) -> None:
        super().__init__(daemon=True)
        self.fleet, self.start_at = fleet, start
        self.samples: list[tuple[float, str, int, float, int]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(SAMPLE_S):
            now = time.monotonic() - self.start_at
            for name, proc in list(self.fleet.procs.items()):
                stats = proc_stats(proc.pid)
                if stats is not None:
                    self.samples.append((now, name, proc.pid, *stats))


def growth(samples: list[tuple[float, str, int, float, int]], name: str,
           minutes: float) -> dict[str, Any]:
    mine = [s for s in samples if s[1] == name]
    pids = list(dict.fromkeys(s[2] for s in mine))
    if len(pids) == 1:  # ran the whole soak: the last minute against the second
        end = max(s[0] for s in mine)
        base = [s for s in mine if 60.0 <= s[0] < 120.0]
        last = [s for s in mine if s[0] >= end - 60.0]
        how = "last minute / second minute"
    else:  # restarted: its last incarnation against its first, at the same age
        first = [s for s in mine if s[2] == pids[0]]
        final = [s for s in mine if s[2] == pids[-1]]
        age = min(first[-1][0] - first[0][0], final[-1][0] - final[0][0])
        base = [s for s in first if s[0] - first[0][0] <= age]
        last = [s for s in final if s[0] - final[0][0] <= age]
        how = f"incarnation {len(pids)} / incarnation 1, first {age:.0f} s of each"
    if not base or not last:
        return {"samples": len(mine), "how": "too few samples"}
    rss0, rss1 = statistics.mean(s[3] for s in base), statistics.mean(s[3] for s in last)
    fd0, fd1 = statistics.mean(s[4] for s in base), statistics.mean(s[4] for s in last)
    return {"incarnations": len(pids), "how": how, "rss_mb_start": round(rss0, 1),
            "rss_mb_end": round(rss1, 1), "rss_growth": round(rss1 / rss0, 4),
            "open_files_start": round(fd0, 1), "open_files_end": round(fd1, 1),
            "open_files_growth": round(fd1 / fd0, 4)}


async def drive(urls: dict[str, str], rate: float, seconds: float, images: Any,
                seed: int) -> list[ov.Sent]:
    return await ov.run_step(urls, rate, seconds, images, seed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=90.0, help="requests per second")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    from tierlink.fleet.launcher import launch
    from tierlink.fleet.tuning import fresh_thresholds
    from tierlink.models.catalog import Catalog, SourceOptions
    from tierlink.zoo.datasets import fashion_mnist

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    config = ov.demo_fleet(ov.EXAMPLE)
    catalog = Catalog.default(SourceOptions(profile=config.zoo_profile))
    models = catalog.paths(config.model_names())
    config, _ = fresh_thresholds(config, models, ov.TASK, say)
    images = fashion_mnist().test.input[:2000]
    sent: list[ov.Sent] = []
    kills: list[dict[str, Any]] = []
    with launch(config, models, Path(tempfile.mkdtemp(prefix="tierlink-soak-")),
                say=say) as fleet:
        urls = {d: fleet.node_urls[d] for d in ov.DEVICES}
        start = time.monotonic()
        sampler = Sampler(fleet, start)
        sampler.start()
        minutes = int(args.minutes)
        for minute in range(minutes):
            load = threading.Thread(target=lambda m=minute: sent.extend(
                asyncio.run(drive(urls, args.rate, 60.0, images, 7000 + m))))
            load.start()
            if minute >= 1:  # the first minute is warm-up, undisturbed
                victim = VICTIMS[(minute - 1) % len(VICTIMS)]
                time.sleep(20.0)
                fleet.kill(victim)
                killed_at = time.monotonic() - start
                time.sleep(DOWN_S)
                fleet.restart_node(victim)
                kills.append({"node": victim, "killed_at_s": round(killed_at, 1),
                              "back_after_s": round(time.monotonic() - start - killed_at, 1)})
                say(f"minute {minute + 1}: killed {victim} at {killed_at:.0f} s, back "
                    f"{kills[-1]['back_after_s']} s later")
            load.join()
            answered = sum(s.status == 200 for s in sent)
            say(f"minute {minute + 1}/{minutes}: {len(sent)} sent, {answered} answered, "
                f"{sum(s.status == 0 for s in sent)} lost")
        sampler.stop_event.set()
        sampler.join()
        names = list(fleet.procs)
    rows = ov.summarize(sent, 0, args.rate)
    processes = {name: growth(sampler.samples, name, args.minutes) for name in names}
    lost = sum(s.status == 0 for s in sent)
    unexplained = sum(s.status not in (0, 200, *ov.REFUSALS) for s in sent)
    worst_rss = max((p.get("rss_growth", 1.0) for p in processes.values()), default=1.0)
    worst_fds = max((p.get("open_files_growth", 1.0) for p in processes.values()), default=1.0)
    report = {"minutes": args.minutes, "rate_per_s": args.rate, "requests": len(sent),
              "by_priority": rows, "lost": lost, "unexplained_errors": unexplained,
              "refused": sum(s.status in ov.REFUSALS for s in sent), "kills": kills,
              "processes": processes, "worst_rss_growth": worst_rss,
              "worst_open_files_growth": worst_fds,
              "passed": lost == 0 and unexplained == 0 and worst_rss <= 1.10
              and worst_fds <= 1.10,
              "command": " ".join(["python", "benchmarks/soak.py", *(argv or sys.argv[1:])])}
    print(f"{'process':<12} {'inc':>3} {'RSS MB start':>12} {'end':>7} {'growth':>7} "
          f"{'fds start':>9} {'end':>5} {'growth':>7}")
    for name, g in processes.items():
        if "rss_growth" in g:
            print(f"{name:<12} {g['incarnations']:>3} {g['rss_mb_start']:>12} "
                  f"{g['rss_mb_end']:>7} {g['rss_growth']:>7} {g['open_files_start']:>9} "
                  f"{g['open_files_end']:>5} {g['open_files_growth']:>7}")
    print(json.dumps({k: report[k] for k in ("requests", "lost", "unexplained_errors",
                                             "refused", "worst_rss_growth",
                                             "worst_open_files_growth", "passed")}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
