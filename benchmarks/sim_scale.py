"""The simulator at fleet scale: 10,000 devices, 200 edges and 10 clouds (the demo's fleet
file replicated), a simulated hour of diurnal load, on one core. Reports simulated requests
per wall-clock minute, peak memory and where the time goes (cProfile, top functions by
their own time, on a slice of the run)::

    .venv/bin/python benchmarks/sim_scale.py [--devices 10000 --edges 200 --clouds 10]
        [--hours 1] [--per-device-rate 0.1] [--profile-s 60] [--json PATH]

``--per-device-rate``: each device's mean requests per second (0.1: 1,000 requests per
second over the fleet, peaking at 1,600 in the diurnal swing).
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fleet", type=Path, default=ROOT / "src/tierlink/demo/fleets/fleet.yaml")
    p.add_argument("--devices", type=int, default=10_000)
    p.add_argument("--edges", type=int, default=200)
    p.add_argument("--clouds", type=int, default=10)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--per-device-rate", type=float, default=0.1)
    p.add_argument("--profile-s", type=float, default=60.0,
                   help="simulated seconds profiled separately (0: none)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from tierlink.fleet.config import load_fleet
    from tierlink.fleet.tuning import fresh_thresholds
    from tierlink.models.catalog import Catalog, SourceOptions
    from tierlink.models.runtime import ModelInfo
    from tierlink.sim.generate import generate
    from tierlink.sim.outcomes import model_outcomes

    base = load_fleet(args.fleet)
    names = tuple(m for m in base.model_names() if m.startswith("fmnist-"))
    catalog = Catalog.default(SourceOptions(profile=base.zoo_profile, progress=False))
    models = catalog.paths(names)
    base, _ = fresh_thresholds(base, models, "fmnist", lambda m: print(m, file=sys.stderr))
    views = {n: ModelInfo.from_card(models[n][1]).view() for n in names}
    config = generate(base, args.devices, args.edges, args.clouds)
    return config, views, model_outcomes("fmnist", names)


def items_for(config: Any, n_samples: int, seconds: float, rate: float, seed: int) -> list:
    from tierlink.sim.workload import Arrivals, workload

    devices = [n.node_id for n in config.nodes if n.tier.label == "device"]
    return workload(Arrivals("diurnal", rate, amplitude=0.6, period_s=seconds), seconds,
                    devices, n_samples, seed)


# Where a request's time goes, by the function that holds it (cumulative time, so the
# parts overlap where one calls another: the policy's plan runs inside the node's handle).
STAGES = {"node.handle (all of a device's work)": ("sim/node.py", "handle"),
          "policy plan": ("policy/placement.py", "plan"),
          "view rebuild (registry, ClusterView)": ("sim/fleet.py", "view_of"),
          "dispatcher steps (decisions)": ("node/dispatcher.py", "steps"),
          "steps carried out (sim/dispatch.py)": ("sim/dispatch.py", "_advance"),
          "scheduler admit": ("node/scheduler.py", "admit"),
          "links (queue, delay)": ("sim/links.py", "_carry")}


def profile(config: Any, views: Any, outcomes: Any, items: list, seed: int,
            top: int = 15) -> dict[str, Any]:
    from tierlink.sim.run import run_once

    prof = cProfile.Profile()
    prof.enable()
    run_once(config, views, outcomes, items, None, seed)
    prof.disable()
    stats = pstats.Stats(prof)
    table = stats.stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in table.values())
    rows = sorted(table.items(), key=lambda kv: -kv[1][2])[:top]
    stages = {label: round(sum(v[3] for (f, _l, name), v in table.items()
                               if f.endswith(path) and name == fn) / total, 4)
              for label, (path, fn) in STAGES.items()}
    return {"requests": len(items), "total_s": round(total, 2),
            "per_request_us": round(1e6 * total / max(1, len(items)), 1),
            "stage_share": stages,
            "top": [{"function": f"{Path(f).name}:{line}({name})", "own_s": round(v[2], 3),
                     "own_share": round(v[2] / total, 4), "cumulative_s": round(v[3], 3)}
                    for (f, line, name), v in rows]}


def plan_cost(config: Any, views: Any, outcomes: Any, items: list, seed: int,
              repeats: int = 20_000) -> dict[str, Any]:
    """What the acting policy's plan costs on its own, outside the event loop and without
    a profiler: a device's view after a few simulated seconds of traffic, rebuilt for each
    plan as each request sees a fresh one (the policy's memos hold for one view only), over
    the workload's mix of requests (privacy, deadline, priority: a ``local`` request has
    one option to price, an ``any`` one every tier's)."""
    import asyncio

    from tierlink.core.types import ClusterView, Request
    from tierlink.policy import REGISTRY
    from tierlink.sim import loop
    from tierlink.sim.build import build
    from tierlink.sim.fleet import drive

    async def warmed() -> tuple[Any, Any]:
        fleet, _ = build(config, views, {outcomes.task: outcomes},
                         asyncio.get_running_loop().time, seed)
        await drive(fleet, items, outcomes.task, outcomes.labels.tolist(),
                    outcomes.input_bytes, None)
        node = fleet.nodes[items[-1].origin]
        fleet.view_of(node)
        return node, node.view

    node, view = loop.run(warmed)
    policy = REGISTRY.create(node.routing.policy, node.routing.policy_config())
    reqs = [Request(f"r{i}", outcomes.task, item.deadline_ms, node.node_id, item.privacy,
                    item.priority, outcomes.input_bytes)
            for i, item in zip(range(repeats), itertools.cycle(items))]
    nodes, links = list(view.nodes.values()), list(view.links.values())
    fresh = [ClusterView.build(view.self_id, nodes, links, {}) for _ in reqs]
    wall = time.perf_counter()
    for req, v in zip(reqs, fresh, strict=True):
        policy.plan(req, v, node.rng)
    plan_us = 1e6 * (time.perf_counter() - wall) / len(reqs)
    wall = time.perf_counter()
    for _ in reqs:
        ClusterView.build(view.self_id, nodes, links, {})
    build_us = 1e6 * (time.perf_counter() - wall) / len(reqs)
    return {"device_plan_us": round(plan_us, 1), "view_build_us": round(build_us, 1),
            "view_nodes": len(nodes), "budget_us_at_target": 60.0,
            "note": "a device's plans over its view (the fleet's own policy) for the "
                    "workload's mix of requests, timed alone; mean per plan"}


def main(argv: list[str] | None = None) -> None:
    from tierlink.sim.run import run_once

    args = parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the issue asks
    config, views, outcomes = setup(args)
    seconds = args.hours * 3600.0
    rate = args.per_device_rate * args.devices
    items = items_for(config, outcomes.size, seconds, rate, args.seed)
    print(f"{len(config.nodes)} nodes, {len(items)} requests over {seconds:.0f} simulated s",
          file=sys.stderr)
    wall = time.perf_counter()
    # The summary is added up as requests are answered: the run keeps no records.
    result = run_once(config, views, outcomes, items, None, args.seed, keep_records=False)
    wall = time.perf_counter() - wall
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = result.summary
    out: dict[str, Any] = {
        "devices": args.devices, "edges": args.edges, "clouds": args.clouds,
        "simulated_s": seconds, "requests": len(items), "wall_s": round(wall, 1),
        "requests_per_min": round(60 * len(items) / wall),
        "peak_rss_mb": round(peak_mb, 1), "target": {"requests_per_min": 600_000,
                                                      "peak_rss_mb": 4096},
        "run": {k: s[k] for k in ("accuracy", "p50_ms", "p95_ms", "sla_attainment",
                                  "tier_share", "lost", "refused", "privacy_violations")},
        "plan_cache": result.counters["plan_cache"],
    }
    if args.profile_s > 0:
        sample = items_for(config, outcomes.size, args.profile_s, rate, args.seed + 1)
        out["profile"] = profile(config, views, outcomes, sample, args.seed)
        out["profile"]["alone"] = plan_cost(config, views, outcomes, sample[:5000], args.seed)
    print(json.dumps({k: v for k, v in out.items() if k != "profile"}, indent=2))
    if "profile" in out:
        prof = out["profile"]
        print(f"profiled: {prof['requests']} requests, {prof['per_request_us']} us each "
              "(under the profiler); share of the time inside:")
        for label, share in prof["stage_share"].items():
            print(f"{100 * share:5.1f}%  {label}")
        alone = prof["alone"]
        print(f"a device's plan alone: {alone['device_plan_us']} us; its view's build "
              f"{alone['view_build_us']} us (60 us per request is the target's budget)")
        for row in prof["top"]:
            print(f"{100 * row['own_share']:5.1f}%  {row['function']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
