"""A sudden burst: does placement pile a burst onto a few nodes where a plain load balancer
would spread it?

On the simulator (the nodes' own policy, dispatcher and scheduler code; simulated time), a
fleet of ``--devices`` devices (a small model each, half a core), ``--edges`` edges and a
cloud takes the demo's mix of requests (realtime 30 ms, interactive 150 ms, batch 1 s;
privacy local / site / any) at ``--rate`` requests/s, with ``--factor`` times that rate for
``--burst-s`` seconds in the middle. The same requests run twice, with the fleet's policy
(``tierlink``, its plan cache on) and with ``power_of_two`` — a plain power-of-two-choices
balancer over the same feasible set (``policy/baselines.py``). Compared: the p99 latency of
the requests sent during the burst, the largest queue any node held
(``Scheduler.peak_queue``), SLA attainment and accuracy. A third run, ``tierlink_unshed``,
is tierlink with the edges' ``escalation_queue`` as deep as their ``max_queue``: what the
burst does when escalations are not refused first (reported, not bounded).

Bound: tierlink's burst p99 and its largest queue ≤ 1.1× power_of_two's. Prints a table,
writes JSON::

    .venv/bin/python benchmarks/hot_spots.py [--json PATH] [--seeds 3] [--devices 20]
        [--edges 4] [--rate 300] [--factor 10] [--burst-s 5] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.core.types import CascadePoint, ModelView
from tierlink.fleet.config import FleetConfig, parse_fleet
from tierlink.sim.build import Scenario
from tierlink.sim.outcomes import Outcomes, synthetic_outcomes
from tierlink.sim.run import run_once
from tierlink.sim.workload import Arrivals, Burst, workload

POLICIES = ("tierlink", "power_of_two", "tierlink_unshed")
UNSHED = 256  # an escalation_queue as deep as max_queue: escalations never refused first
BOUND = 1.1
N = 5000  # inputs of the synthetic task


def outcomes(seed: int) -> Outcomes:
    """A task whose models share a difficulty (a cascade meets a real joint behaviour)."""
    return synthetic_outcomes("t", {"small": 0.80, "medium": 0.88, "large": 0.95}, N, seed)


def views() -> dict[str, ModelView]:
    curve = tuple(CascadePoint(t, 0.8, 0.97) for t in (0.5, 0.8, 0.9))
    return {"small": ModelView("small", "t", "1", 0.80, 1.0, cascade=curve),
            "medium": ModelView("medium", "t", "1", 0.88, 2.0, cascade=curve),
            "large": ModelView("large", "t", "1", 0.95, 4.0)}


def fleet(devices: int, edges: int, escalation_queue: int | None = None) -> FleetConfig:
    devs = [f"dev-{i}" for i in range(1, devices + 1)]
    eds = [f"edge-{i}" for i in range(1, edges + 1)]
    return parse_fleet({
        "name": "burst", "seed": 3,
        "routing": {"policy": "tierlink", "allow_policy_override": True,
                    "thresholds": {"small": 0.9, "medium": 0.9}},
        "nodes": [{"id": "cloud-1", "tier": "cloud", "models": ["large"], "workers": 4},
                  *({"id": e, "tier": "edge", "models": ["medium"],
                     "escalation_queue": escalation_queue} for e in eds),
                  *({"id": d, "tier": "device", "models": ["small"], "cpu_quota": 0.5}
                    for d in devs)],
        "links": [{"from": devs, "to": eds, "delay_ms": 5, "bandwidth_mbit": 100},
                  {"from": eds, "to": "cloud-1", "delay_ms": 40, "bandwidth_mbit": 50}]})


def one(args: argparse.Namespace, seed: int, policy: str) -> dict[str, Any]:
    config = fleet(args.devices, args.edges, UNSHED if policy == "tierlink_unshed" else None)
    devices = [n.node_id for n in config.nodes if n.tier.label == "device"]
    start = args.seconds / 2 - args.burst_s / 2
    arrivals = Arrivals("poisson", args.rate, bursts=(Burst(start, start + args.burst_s,
                                                            args.factor),))
    items = workload(arrivals, args.seconds, devices, N, seed=seed)
    result = run_once(config, views(), outcomes(seed), items, policy.removesuffix("_unshed"),
                      seed,
                      scenario=Scenario())
    burst = [r for r in result.records if start <= r.item.at_s < start + args.burst_s]
    latency = [r.latency_ms for r in burst if r.answered]
    peaks = result.counters["peak_queue"]
    return {"burst_p99_ms": float(np.percentile(latency, 99)) if latency else None,
            "burst_requests": len(burst), "burst_answered": len(latency),
            "largest_queue": max(peaks.values(), default=0),
            "largest_queue_at": max(peaks, key=lambda n: peaks[n]) if peaks else None,
            "sla_attainment": result.summary["sla_attainment"],
            "accuracy": result.summary["accuracy"], "requests": len(items)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = {p: [one(args, seed, p) for seed in range(1, args.seeds + 1)] for p in POLICIES}
    ours, theirs = runs["tierlink"], runs["power_of_two"]
    ratios = {key: [a[key] / b[key] if b[key] else float("inf")
                    for a, b in zip(ours, theirs, strict=True)]
              for key in ("burst_p99_ms", "largest_queue")}
    median = {k: statistics.median(v) for k, v in ratios.items()}
    return {"runs": runs, "ratios": ratios, "median_ratio": median,
            "bound": f"tierlink's burst p99 and largest queue <= {BOUND}x power_of_two's "
                     "(median over seeds)",
            "met": all(v <= BOUND for v in median.values()),
            "settings": {k: v for k, v in vars(args).items() if k != "json"}}


def print_table(result: dict[str, Any]) -> None:
    print(f"{'policy':14}{'seed':>5}{'burst p99 ms':>14}{'largest queue':>15}{'SLA':>8}"
          f"{'accuracy':>10}")
    for policy, runs in result["runs"].items():
        for seed, r in enumerate(runs, 1):
            print(f"{policy:14}{seed:>5}{r['burst_p99_ms']:>14.1f}{r['largest_queue']:>15}"
                  f"{r['sla_attainment']:>8.3f}{r['accuracy']:>10.4f}")
    m = result["median_ratio"]
    print(f"tierlink / power_of_two (median over seeds): burst p99 x{m['burst_p99_ms']:.3f}, "
          f"largest queue x{m['largest_queue']:.3f}; bound {BOUND}: "
          f"{'met' if result['met'] else 'NOT met'}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--edges", type=int, default=4)
    parser.add_argument("--rate", type=float, default=300.0, help="requests/s before the burst")
    parser.add_argument("--factor", type=float, default=10.0, help="the burst's rate multiple")
    parser.add_argument("--burst-s", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
