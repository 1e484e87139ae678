"""What the registry view costs the control plane, before and after a change, side by side.

Every node fetches ``GET /v1/nodes`` (the whole fleet) every second, so the control plane's
work per call times the calls grows with the square of the fleet. Two control planes run
side by side: one from ``--old-rev`` (a temporary ``git worktree``, its ``src`` first on
``PYTHONPATH``), one from the working tree, each ``--open`` on its own SQLite file. Each is
given ``--nodes`` synthetic nodes (heartbeats shaped like a MobileNetV2 node's: one model
with a split profile of 19 cuts x 6 codecs, two links), then the view a node fetches each
second, ``GET /v1/nodes?splits=digest`` (a control plane that predates the option ignores
it and sends the profiles inline), is called ``--calls`` times per round, rounds
alternating between the two; per control plane: wall p50 / p99 per call, its CPU ms per
call (``/proc/PID/stat``, medians over rounds), and the response size. ``--full`` asks
for the profiles inline from both (what an operator's listing gets). Prints a table with old/new ratios and writes JSON::

    .venv/bin/python benchmarks/registry_read.py --old-rev REV [--nodes 100] [--rounds 8]
        [--calls 50] [--full] [--json PATH]

Both processes and the worktree are removed at the end, also on error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from ab_support import cli, cpu_s, short_rev, worktree

CODECS = ("fp32", "fp16", "int8", "int8+zstd", "fp16+zstd", "int8c+zstd")


def heartbeat(i: int) -> dict[str, Any]:
    """A node like a MobileNetV2 device of the demo: one model with its split profile."""
    splits = [{"cut": f"/features/features.{k}/Add_output_0", "head_ms": 0.7 * k,
               "tail_ms": 14.0 - 0.7 * k, "feature_bytes": 100_000 - 4000 * k,
               "codecs": [{"codec": c, "wire_bytes": 50_000 - 1000 * k + j,
                           "encode_ms": 0.1 + 0.01 * j, "decode_ms": 0.05 + 0.01 * j}
                          for j, c in enumerate(CODECS)]}
              for k in range(1, 20)]
    return {"node_id": f"node-{i:03d}", "tier": ("device", "edge", "cloud")[i % 3],
            "address": f"http://127.0.0.1:{20000 + i}",
            "models": [{"name": "imagenet-mobilenetv2", "task": "imagenet", "version": "1",
                        "accuracy": 0.718, "latency_ms": 14.2, "output_bytes": 4000,
                        "splits": splits}],
            "queue_depth": i % 4, "inflight": 0, "workers": 1,
            "links": [{"dst": f"node-{(i + 1) % 1000:03d}", "rtt_ms": 10.0, "bandwidth_mbit": 100.0},
                      {"dst": f"node-{(i + 2) % 1000:03d}", "rtt_ms": 50.0, "bandwidth_mbit": 20.0}],
            "started_at": 1_733_139_000.0 + i}


def start_control(stack: ExitStack, name: str, src: Path | None) -> tuple[str, int]:
    """A control plane whose code comes from ``src`` (None: this tree); (url, pid)."""
    run = Path(tempfile.mkdtemp(prefix=f"tierlink-registry-read-{name}-"))
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src) + (os.pathsep + env["PYTHONPATH"]
                                        if env.get("PYTHONPATH") else "")
    ready = run / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "tierlink.control.server", "--port", "0",
                             "--db", str(run / "control.db"), "--ttl", "3600", "--open",
                             "--ready-file", str(ready)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(_stop, proc)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {name} control plane did not start")
        time.sleep(0.05)
    return f"http://127.0.0.1:{json.loads(ready.read_text())['port']}", proc.pid


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    old = short_rev(args.old_rev)
    samples: dict[str, dict[str, list[float]]] = {}
    sizes: dict[str, int] = {}
    with ExitStack() as stack, httpx.Client(timeout=60.0, trust_env=False) as http:
        planes = {"old": start_control(stack, "old", worktree(stack, old, "tierlink-registry-read-") / "src"),
                  "new": start_control(stack, "new", None)}
        for url, _ in planes.values():
            for i in range(args.nodes):
                body = heartbeat(i)
                http.post(f"{url}/v1/nodes/{body['node_id']}/heartbeat",
                          json=body).raise_for_status()
        query = {} if args.full else {"splits": "digest"}
        for name, (url, _) in planes.items():
            response = http.get(f"{url}/v1/nodes", params=query)
            response.raise_for_status()
            assert len(response.json()["nodes"]) == args.nodes
            sizes[name] = len(response.content)
            samples[name] = {"wall": [], "cpu": []}
        for i in range(args.rounds):
            for name, (url, pid) in planes.items():
                cpu0 = cpu_s(pid)
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    http.get(f"{url}/v1/nodes", params=query).raise_for_status()
                    samples[name]["wall"].append((time.perf_counter() - t0) * 1000.0)
                samples[name]["cpu"].append((cpu_s(pid) - cpu0) * 1000.0 / args.calls)
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
    result = {k: {"wall_p50_ms": statistics.median(v["wall"]),
                  "wall_p99_ms": float(np.percentile(v["wall"], 99)),
                  "server_cpu_ms_per_call": statistics.median(v["cpu"]),
                  "response_bytes": sizes[k]} for k, v in samples.items()}
    ratios = {m: result["old"][m] / result["new"][m] for m in result["new"]
              if m != "response_bytes"}
    return {"old_rev": old, **result, "old_over_new": ratios,
            "settings": {"nodes": args.nodes, "rounds": args.rounds, "calls": args.calls,
                         "query": query}}


def print_table(result: dict[str, Any]) -> None:
    print(f"GET /v1/nodes {result['settings']['query']} with {result['settings']['nodes']} "
          f"nodes: {result['old']['response_bytes'] / 1e6:.3f} MB per answer (old), "
          f"{result['new']['response_bytes'] / 1e6:.3f} MB (new)")
    print(f"{'':26}{'old ' + result['old_rev']:>14}{'new':>10}{'old/new':>10}")
    for m in ("wall_p50_ms", "wall_p99_ms", "server_cpu_ms_per_call"):
        print(f"{m:26}{result['old'][m]:14.2f}{result['new'][m]:10.2f}"
              f"{result['old_over_new'][m]:10.2f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=50, help="GET /v1/nodes per round")
    parser.add_argument("--full", action="store_true",
                        help="profiles inline from both (not the nodes' digest view)")


def main(argv: list[str] | None = None) -> None:
    cli(__doc__ or "", add_arguments, run, print_table, argv)


if __name__ == "__main__":
    main()
