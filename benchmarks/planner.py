"""A capacity plan, checked in the simulator: each plan of ``tierlink plan`` (the placement,
all-cloud, all-edge) built as a fleet and driven at the use cases' P95 rate (what it was
sized for) and at their peak, with each request's deadline its use case's latency target.

Per use case whose model the simulator can answer for (the zoo's ``fmnist-*``): the plan's
instances of its hardware become nodes whose speed makes one request take what the
catalogue's throughput says (``1 / throughput``); requests arise on the use case's devices
(a device-tier placement: those devices answer them) or on ten site gateways linked to the
instances at the inventory's RTT for that tier. The plan runs the ``tierlink`` policy; the
baselines run what a team without placement runs (``cloud_only``: everything to the cloud,
privacy regardless; all-edge: the most capable tier reachable, which is the edge)::

    .venv/bin/python benchmarks/planner.py [examples/inventory.yaml] [--seconds 60] [--json PATH]

JSON: ``plan``, ``all_cloud``, ``all_edge``, each with ``sla_at_p95``, ``sla_at_peak``,
``sla_target``, ``monthly_usd`` and per-use-case figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GATEWAYS = 10
BASELINE_POLICY = {"plan": "tierlink", "all_cloud": "cloud_only", "all_edge": "static_rules"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inventory", nargs="?", type=Path, default=ROOT / "examples/inventory.yaml")
    p.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per load")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def fleet_for(uc: Any, placed: Any, inv: Any, views: Any) -> tuple[Any, dict[str, float],
                                                                    list[str]]:
    """The use case's fleet under ``placed``: nodes, links, each node's speed; the origins."""
    from tierlink.core.types import Tier
    from tierlink.fleet.config import FleetConfig, LinkConfig, NodeConfig, RoutingConfig

    hw = next(h for h in inv.hardware if h.name == placed.hardware)
    tp = hw.throughput[uc.model]
    speed = tp.per_s * views[uc.model].latency_ms / 1000.0  # one request = 1 / throughput
    tier = Tier.parse(placed.tier)
    if tier is Tier.DEVICE:
        nodes = tuple(NodeConfig(f"dev-{i + 1}", Tier.DEVICE, (uc.model,))
                      for i in range(placed.instances))
        return (FleetConfig(f"{uc.name}", nodes, (), RoutingConfig(allow_policy_override=True)),
                {n.node_id: speed for n in nodes}, [n.node_id for n in nodes])
    servers = tuple(NodeConfig(f"{tier.label}-{i + 1}", tier, (uc.model,), max_queue=4096)
                    for i in range(placed.instances))
    gateways = tuple(NodeConfig(f"gw-{i + 1}", Tier.DEVICE, ()) for i in range(GATEWAYS))
    links = tuple(LinkConfig(g.node_id, s.node_id, inv.rtt_ms[tier] / 2.0, 0.0, 1000.0)
                  for g in gateways for s in servers)
    return (FleetConfig(uc.name, servers + gateways, links,
                        RoutingConfig(allow_policy_override=True)),
            {s.node_id: speed for s in servers}, [g.node_id for g in gateways])


def items_for(uc: Any, rate: float, seconds: float, origins: list[str], n_samples: int,
              seed: int) -> list[Any]:
    import random

    from tierlink.core.types import Priority
    from tierlink.fleet.workload import WorkItem
    from tierlink.sim.workload import Arrivals, arrival_times

    rng = random.Random(f"{seed}:{uc.name}")
    times = arrival_times(Arrivals("poisson", rate), seconds, rng)
    return [WorkItem(i, rng.randrange(n_samples), rng.choice(origins), uc.latency_ms,
                     Priority.INTERACTIVE, uc.privacy, t) for i, t in enumerate(times)]


def simulate_plan(name: str, plan: Any, inv: Any, views: Any, outcomes: Any,
                  seconds: float, seed: int) -> dict[str, Any]:
    from tierlink.sim.build import Scenario
    from tierlink.sim.run import run_once

    per_case: dict[str, Any] = {}
    totals = {"p95": [0, 0], "peak": [0, 0]}
    for uc in inv.use_cases:
        placed = next((p for p in plan.placed if p.use_case == uc.name), None)
        if uc.model not in views:
            per_case[uc.name] = {"simulated": False, "why": "no recorded answers for "
                                 f"{uc.model or 'training'}"}
            continue
        if placed is None or not placed.tier:
            per_case[uc.name] = {"simulated": True, "sla_at_p95": 0.0, "sla_at_peak": 0.0,
                                 "why": placed.why if placed else "not placed"}
            for load, rate in (("p95", uc.p95_rps), ("peak", uc.peak_rps)):
                totals[load][1] += int(rate * seconds)
            continue
        config, speed, origins = fleet_for(uc, placed, inv, views)
        row: dict[str, Any] = {"simulated": True, "tier": placed.tier,
                               "instances": placed.instances}
        for load, rate in (("p95", uc.p95_rps), ("peak", uc.peak_rps)):
            items = items_for(uc, rate, seconds, origins, outcomes.size, seed)
            result = run_once(config, views, outcomes, items, BASELINE_POLICY[name], seed,
                              Scenario(speed=speed, jitter=0.1))
            s = result.summary
            met = round(s["sla_attainment"] * s["requests"])
            totals[load][0] += met
            totals[load][1] += s["requests"]
            row[f"sla_at_{load}"] = round(s["sla_attainment"], 4)
            row[f"p95_ms_at_{load}"] = round(s["p95_ms"], 2)
            row[f"privacy_violations_at_{load}"] = s["privacy_violations"]
        per_case[uc.name] = row
    d = plan.to_dict()
    return {"monthly_usd": d["monthly_usd"], "sla_target": inv.sla_target,
            "sla_at_p95": round(totals["p95"][0] / max(totals["p95"][1], 1), 4),
            "sla_at_peak": round(totals["peak"][0] / max(totals["peak"][1], 1), 4),
            "privacy_violations": d["privacy_violations"], "use_cases": per_case}


def main(argv: list[str] | None = None) -> None:
    from tierlink.core.types import Tier
    from tierlink.models.catalog import Catalog, SourceOptions
    from tierlink.models.runtime import ModelInfo
    from tierlink.plan.inventory import load_inventory
    from tierlink.plan.planner import fixed, plan
    from tierlink.sim.outcomes import model_outcomes

    args = parse_args(argv)
    inv = load_inventory(args.inventory)
    names = tuple(sorted({u.model for u in inv.use_cases if u.model.startswith("fmnist-")}))
    catalog = Catalog.default(SourceOptions(profile="full", progress=False))
    models = catalog.paths(names)
    views = {n: ModelInfo.from_card(models[n][1]).view() for n in names}
    outcomes = model_outcomes("fmnist", names)
    plans = {"plan": plan(inv), "all_cloud": fixed(inv, Tier.CLOUD),
             "all_edge": fixed(inv, Tier.EDGE)}
    result = {name: simulate_plan(name, p, inv, views, outcomes, args.seconds, args.seed)
              for name, p in plans.items()}
    result["seconds_per_load"] = args.seconds  # type: ignore[assignment]
    for name in plans:
        r = result[name]
        print(f"{name:<10} ${r['monthly_usd']:>9,.2f}/month  SLA at P95 {100 * r['sla_at_p95']:.1f}%"
              f"  at peak {100 * r['sla_at_peak']:.1f}%  (target {100 * r['sla_target']:.0f}%)"
              f"  privacy violations: {', '.join(r['privacy_violations']) or 'none'}",
              file=sys.stdout)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
