"""The forwarding hop, before and after a change: two identical fleets side by side in one run.

One fleet runs the code of ``--old-rev`` (checked out into a temporary ``git worktree``, its
processes started with that tree's ``src`` first on ``PYTHONPATH``), the other the working
tree. Each fleet: ``edge-1`` serving ``fmnist-small`` and ``dev-1`` holding no model, linked
through the link emulator with no delay, so every ``fmnist`` request posted to ``dev-1`` is
forwarded to ``edge-1`` (the hop a device pays for every request it sends upstream). Rounds
of ``--requests`` sequential requests alternate between the fleets so machine drift hits both
alike; per fleet: wall p50 / p99 of the whole request, and CPU ms per request of ``dev-1``
(the forwarding node) and ``edge-1`` (from ``/proc/PID/stat``, medians over rounds). Prints a
table with the old/new ratios and writes JSON::

    .venv/bin/python benchmarks/hop_ab.py --old-rev REV [--rounds 12] [--requests 100]
        [--json PATH]

Every process and the worktree are removed at the end, also on error.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from ab_support import cli, cpu_s, short_rev, worktree

from tierlink.fleet.config import parse_fleet
from tierlink.fleet.launcher import RunningFleet, launch
from tierlink.transport.oip import encode_infer_request

FLEET = """
name: hop-ab
seed: 1
zoo: {profile: test}
control: {ttl_s: 10}
nodes:
  - {id: edge-1, tier: edge, models: [fmnist-small]}
  - {id: dev-1, tier: device, models: []}
links:
  - {from: dev-1, to: edge-1, delay_ms: 0}
"""


def start(stack: ExitStack, name: str, src: Path | None, models: dict[str, Any]) -> RunningFleet:
    """A fleet whose processes import tierlink from ``src`` (None: this tree)."""
    saved = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = str(src) + (os.pathsep + saved if saved else "")
    try:
        fleet = launch(parse_fleet(yaml.safe_load(FLEET), source=f"<hop-ab {name}>"), models,
                       Path(tempfile.mkdtemp(prefix=f"tierlink-hop-ab-{name}-")))
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    stack.callback(fleet.stop)
    return fleet


def measure(fleets: dict[str, RunningFleet], rounds: int, per_round: int) -> dict[str, Any]:
    x = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    body, headers = encode_infer_request({"input": x}, {"tierlink.privacy": "any"}, None,
                                         binary_inputs=True, binary_outputs=True)
    samples: dict[str, dict[str, list[float]]] = {
        k: {"wall": [], "dev": [], "edge": []} for k in fleets}
    with httpx.Client(timeout=30.0, trust_env=False) as http:
        for fleet in fleets.values():  # warm: sessions, connections, link estimates
            for _ in range(50):
                http.post(f"{fleet.node_urls['dev-1']}/v2/models/fmnist/infer", content=body,
                          headers=headers).raise_for_status()
        for i in range(rounds):
            for name, fleet in fleets.items():
                url = f"{fleet.node_urls['dev-1']}/v2/models/fmnist/infer"
                dev, edge = fleet.procs["dev-1"].pid, fleet.procs["edge-1"].pid
                dev0, edge0 = cpu_s(dev), cpu_s(edge)
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    http.post(url, content=body, headers=headers).raise_for_status()
                    samples[name]["wall"].append((time.perf_counter() - t0) * 1000.0)
                samples[name]["dev"].append((cpu_s(dev) - dev0) * 1000.0 / per_round)
                samples[name]["edge"].append((cpu_s(edge) - edge0) * 1000.0 / per_round)
            print(f"round {i + 1}/{rounds} done", file=sys.stderr)
    return {k: {"wall_p50_ms": statistics.median(v["wall"]),
                "wall_p99_ms": float(np.percentile(v["wall"], 99)),
                "dev_cpu_ms_per_request": statistics.median(v["dev"]),
                "edge_cpu_ms_per_request": statistics.median(v["edge"]),
                "requests": len(v["wall"])} for k, v in samples.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tierlink.zoo import ensure_zoo

    zoo = ensure_zoo(profile="test", progress=False)
    models = {"fmnist-small": (zoo.path("fmnist-small"), zoo.card_path("fmnist-small"))}
    old = short_rev(args.old_rev)
    with ExitStack() as stack:
        tree = worktree(stack, old, "tierlink-hop-ab-")
        fleets = {"old": start(stack, "old", tree / "src", models),
                  "new": start(stack, "new", None, models)}
        result = measure(fleets, args.rounds, args.requests)
    ratios = {m: result["old"][m] / result["new"][m] for m in result["new"] if m != "requests"}
    return {"old_rev": old, **result, "old_over_new": ratios,
            "settings": {"rounds": args.rounds, "requests_per_round": args.requests}}


def print_table(result: dict[str, Any]) -> None:
    metrics = ("wall_p50_ms", "wall_p99_ms", "dev_cpu_ms_per_request", "edge_cpu_ms_per_request")
    print(f"{'':26}{'old ' + result['old_rev']:>14}{'new':>10}{'old/new':>10}")
    for m in metrics:
        print(f"{m:26}{result['old'][m]:14.3f}{result['new'][m]:10.3f}"
              f"{result['old_over_new'][m]:10.2f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--requests", type=int, default=100, help="requests per round")


def main(argv: list[str] | None = None) -> None:
    cli(__doc__ or "", add_arguments, run, print_table, argv)


if __name__ == "__main__":
    main()
