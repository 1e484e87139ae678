"""Prices that change with the hour, in the simulator: a day of the demo's fleet under a
time-of-day price schedule, with a share of the requests asynchronous and allowed to wait.

A simulated 24-hour diurnal run (the demo's fleet and request mix; the load peaks at noon).
The edge and the cloud are priced by the hour (``SCHEDULE``: a peak by day, a valley by
night; devices pay their energy at a flat price); ``--async-share`` of the requests (30%)
are asynchronous batch requests of privacy ``any`` with ``--async-deadline-h`` (6 h)
deadlines. Three runs over the same requests:

* ``flat``: no schedule (what the other classes' SLA attainment is judged against);
* ``priced``: the schedule, asynchronous requests run at once (placement prices its options
  at the hour; nothing waits);
* ``deferred``: the schedule, asynchronous requests wait for the window where their plan
  costs least (``routing/deferral.py``, as a live node's ``node/deferred.py``).

The oracle moves every asynchronous request of ``priced`` to the moment, within its
deadline less the margin, where its own bill (the same parts at each tier) is cheapest, and
keeps the rest: what deferring could save at most. Bounds: ``deferred`` saves at least 80%
of the oracle's saving; no asynchronous request misses its deadline; the other classes'
SLA attainment within 0.5 point of ``flat``::

    .venv/bin/python benchmarks/prices.py [--rate 2] [--async-share 0.3]
        [--async-deadline-h 6] [--seed 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "src/tierlink/demo/fleets/fleet.yaml"
DAY_S = 86_400.0
# Edge and cloud: 1.5x from 08:00 to 20:00, 0.4x from 23:00 to 07:00 (UTC), 1x between.
SCHEDULE = [{"from": "08:00", "to": "20:00", "factor": 1.5},
            {"from": "23:00", "to": "07:00", "factor": 0.4}]
BOUNDS = {"saving_vs_oracle": 0.8, "deadline_misses": 0, "sla_points": 0.5}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=2.0, help="mean requests per second")
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--async-share", type=float, default=0.3)
    p.add_argument("--async-deadline-h", type=float, default=6.0)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def setup() -> tuple[Any, Any, Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bandit import setup as bandit_setup  # the demo fleet, its models, their answers

    return bandit_setup()


def priced(config: Any) -> Any:
    from tierlink.settings.routing import parse_cost

    cost = parse_cost({**config.routing.cost.to_mapping(),
                       "schedule": {"edge": SCHEDULE, "cloud": SCHEDULE}})
    return replace(config, routing=replace(config.routing, cost=cost))


def workload(config: Any, outcomes: Any, args: argparse.Namespace) -> list[Any]:
    """The day's requests: diurnal arrivals in the demo's mix; a seeded share asynchronous
    (batch priority, privacy ``any``, the long deadline)."""
    import random

    from tierlink.core.types import Priority, Privacy
    from tierlink.sim.workload import Arrivals
    from tierlink.sim.workload import workload as sim_workload

    devices = [n.node_id for n in config.nodes if n.tier.label == "device"]
    items = sim_workload(Arrivals("diurnal", args.rate, amplitude=0.6), args.hours * 3600,
                         devices, outcomes.size, args.seed)
    rng = random.Random(f"{args.seed}:async")
    return [replace(it, asynchronous=True, priority=Priority.BATCH, privacy=Privacy.ANY,
                    deadline_ms=args.async_deadline_h * 3_600_000.0)
            if rng.random() < args.async_share else it for it in items]


def run(config: Any, views: Any, outcomes: Any, items: list[Any], seed: int,
        defer: bool) -> Any:
    from tierlink.sim.build import Scenario
    from tierlink.sim.run import run_once

    return run_once(config, views, outcomes, items, None, seed, Scenario(defer=defer))


def oracle_cost(records: list[Any], cost: Any, margin_s: float) -> float:
    """The bill with every asynchronous request moved to its cheapest moment (see the
    module); the others as they were."""
    from tierlink.core.types import Tier

    changes = cost.changes()
    total = 0.0
    for r in records:
        if not r.answered:
            continue
        if not r.item.asynchronous:
            total += r.cost
            continue
        ran_at = r.item.at_s + r.latency_ms / 1000.0
        flat = {(t, part): usd / cost.factor(t, ran_at % DAY_S)
                for t, part, usd in r.bill.items()}
        latest = r.item.at_s + r.item.deadline_ms / 1000.0 - margin_s
        moments = [r.item.at_s] + [d * DAY_S + c for d in range(int(latest // DAY_S) + 2)
                                   for c in changes if r.item.at_s < d * DAY_S + c <= latest]
        total += min(sum(usd * cost.factor(Tier(t), m % DAY_S) for (t, _), usd in flat.items())
                     for m in moments)
    return total


def summary(records: list[Any]) -> dict[str, Any]:
    asyn = [r for r in records if r.item.asynchronous]
    other = [r for r in records if not r.item.asynchronous]
    waited = [r.latency_ms / 1000.0 for r in asyn if r.answered]
    return {
        "requests": len(records), "asynchronous": len(asyn),
        "cost_usd": sum(r.cost for r in records if r.answered),
        "async_cost_usd": sum(r.cost for r in asyn if r.answered),
        "deadline_misses": sum(1 for r in asyn if not r.in_sla),
        "async_waited_mean_h": round(sum(waited) / len(waited) / 3600, 3) if waited else 0.0,
        "other_sla_attainment": sum(r.in_sla for r in other) / max(len(other), 1),
        "other_accuracy": sum(r.correct for r in other) / max(len(other), 1),
        "lost": sum(r.lost for r in records),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from tierlink.routing.deferral import DEFER_MARGIN_S

    config, views, outcomes = setup()
    scheduled = priced(config)
    items = workload(config, outcomes, args)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                              "schedule": {"edge": SCHEDULE, "cloud": SCHEDULE},
                              "bounds": BOUNDS, "runs": {}}
    records = {}
    for name, cfg, defer in (("flat", config, False), ("priced", scheduled, False),
                             ("deferred", scheduled, True)):
        t0 = time.perf_counter()
        out = run(cfg, views, outcomes, items, args.seed, defer)
        records[name] = out.records
        result["runs"][name] = {**summary(out.records),
                                "wall_s": round(time.perf_counter() - t0, 1)}
        print(f"{name}: {json.dumps(result['runs'][name])}", file=sys.stderr)
    runs = result["runs"]
    oracle = oracle_cost(records["priced"], scheduled.routing.cost, DEFER_MARGIN_S)
    saved, best = runs["priced"]["cost_usd"] - runs["deferred"]["cost_usd"], \
        runs["priced"]["cost_usd"] - oracle
    sla_points = 100 * (runs["flat"]["other_sla_attainment"]
                        - runs["deferred"]["other_sla_attainment"])
    result["oracle_cost_usd"] = oracle
    result["saving_usd"], result["oracle_saving_usd"] = saved, best
    result["saving_vs_oracle"] = saved / best if best > 0 else 0.0
    result["other_sla_points_below_flat"] = round(sla_points, 3)
    result["met"] = {
        "saving_vs_oracle": result["saving_vs_oracle"] >= BOUNDS["saving_vs_oracle"],
        "deadline_misses": runs["deferred"]["deadline_misses"] == 0,
        "sla_points": sla_points <= BOUNDS["sla_points"]}
    print(f"{'run':10} {'cost USD':>12} {'async USD':>12} {'misses':>7} "
          f"{'async wait h':>12} {'other SLA':>10}")
    for name, r in runs.items():
        print(f"{name:10} {r['cost_usd']:12.6f} {r['async_cost_usd']:12.6f} "
              f"{r['deadline_misses']:7d} {r['async_waited_mean_h']:12.3f} "
              f"{100 * r['other_sla_attainment']:9.2f}%")
    print(f"oracle     {oracle:12.6f}   saving {saved:.6f} of the oracle's {best:.6f} "
          f"({100 * result['saving_vs_oracle']:.1f}%, bound >= 80%); other classes' SLA "
          f"{sla_points:+.2f} points below flat (bound 0.5); met: {result['met']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
