"""``tierlink plan INVENTORY.yaml``: a placement per use case, instances and monthly cost
per tier, training runs, beside the all-cloud and all-edge plans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def plan_report(path: Path) -> dict[str, Any]:
    from tierlink.core.types import Tier
    from tierlink.plan.inventory import load_inventory
    from tierlink.plan.planner import fixed, plan

    inv = load_inventory(path)
    return {"inventory": str(path), "headroom": inv.headroom,
            "plan": plan(inv).to_dict(), "all_cloud": fixed(inv, Tier.CLOUD).to_dict(),
            "all_edge": fixed(inv, Tier.EDGE).to_dict()}


def print_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console = Console()
    p = report["plan"]
    table = Table("use case", "tier", "hardware", "instances", "latency ms", "USD / month",
                  title=f"plan (P95 x {1 + report['headroom']:.2f})")
    for u in p["use_cases"]:
        table.add_row(u["name"], u["tier"] or "-", u["hardware"] or "-", str(u["instances"]),
                      f"{u['latency_ms']:.1f}", f"{u['monthly_usd']:,.2f}",
                      style=None if u["privacy_ok"] and u["sla_ok"] else "red")
    for t in p["training"]:
        table.add_row(f"{t['use_case']} (training)", "cloud", t["hardware"], str(t["cards"]),
                      f"{t['gpu_hours']:.2f} GPU-h", f"{t['usd_per_run']:,.2f} / run")
    console.print(table)
    compare = Table("", "USD / month", "by tier", "privacy violations", "latency misses",
                    title="against what a team would run without placement")
    for key in ("plan", "all_cloud", "all_edge"):
        r = report[key]
        tiers = ", ".join(f"{k} {v['instances']}" for k, v in r["by_tier"].items())
        compare.add_row(key, f"{r['monthly_usd']:,.2f}", tiers,
                        ", ".join(r["privacy_violations"]) or "0",
                        ", ".join(r["sla_misses"]) or "0")
    console.print(compare)
