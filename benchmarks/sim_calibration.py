"""The simulator against the real fleet: the demo's fleet and workload, live and simulated,
side by side, with issue 16's bounds (p50 and p95 within 15% per run, tier shares within 3
points, SLA attainment within 2 points).

The live side is a ``tierlink demo --quick`` report (run now, or ``--live PATH`` to read
one). The simulator is not fitted to it: its only inputs beyond the fleet file and the
models' cards are the HTTP costs this machine measured on its own
(``benchmarks/routing_overhead.py``'s hop part: ``request_ms`` = a routed request answered
on the node minus the model's in-process time; ``hop_ms`` = a forwarded request minus the
same request sent straight to the edge)::

    .venv/bin/python benchmarks/sim_calibration.py [--live docs/results/demo-quick.json]
        [--overheads docs/results/routing-overhead.json] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "src/tierlink/examples/fleet.yaml"
BOUNDS = {"latency_rel": 0.15, "tier_share_pts": 3.0, "sla_pts": 2.0}
RUNS = ("tierlink", "static_rules", "cloud_only", "device_only")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--live", type=Path, help="a demo --quick JSON (default: run one now)")
    p.add_argument("--overheads", type=Path,
                   default=ROOT / "docs/results/routing-overhead.json")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def overheads(path: Path) -> dict[str, float]:
    hop = json.loads(path.read_text())["hop"]
    p50 = {k: hop[f"{k}_ms"]["p50"] for k in ("inprocess", "routed_local", "forwarded",
                                             "edge_routed")}
    return {"request_ms": round(p50["routed_local"] - p50["inprocess"], 3),
            "hop_ms": round(p50["forwarded"] - p50["edge_routed"], 3), "source": str(path)}


def live_report(path: Path | None) -> dict[str, Any]:
    if path is not None:
        return dict(json.loads(path.read_text()))
    out = Path(tempfile.mkdtemp()) / "live.json"
    tierlink = Path(sys.executable).parent / "tierlink"
    subprocess.run([str(tierlink), "demo", "--quick", "--json", str(out)], check=True)
    return dict(json.loads(out.read_text()))


def simulated(costs: dict[str, float]) -> dict[str, Any]:
    from tierlink.cli.sim import run_sim
    from tierlink.fleet.demo import DemoSettings

    settings = DemoSettings.quick()
    scenario = Path(tempfile.mkdtemp()) / "calibration.yaml"
    scenario.write_text(f"request_ms: {costs['request_ms']}\nhop_ms: {costs['hop_ms']}\n")
    return run_sim(FLEET, scenario_file=scenario, requests=settings.requests,
                   rate=settings.rate_per_s, arrivals=None, duration_s=None,
                   seed=settings.seed, runs=",".join(RUNS), json_path=None, png_path=None,
                   progress=sys.stderr.isatty())


def compare(live: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run in RUNS:
        a, b = live[run], sim[run]
        row = {f"{k}_rel": round(b[k] / a[k] - 1.0, 4) for k in ("p50_ms", "p95_ms")}
        row["tier_share_pts"] = round(max(abs(100 * (b["tier_share"][t] - a["tier_share"][t]))
                                          for t in ("device", "edge", "cloud")), 2)
        row["sla_pts"] = round(100 * (b["sla_attainment"] - a["sla_attainment"]), 2)
        row["accuracy_pts"] = round(100 * (b["accuracy"] - a["accuracy"]), 2)
        row["within"] = (abs(row["p50_ms_rel"]) <= BOUNDS["latency_rel"]
                         and abs(row["p95_ms_rel"]) <= BOUNDS["latency_rel"]
                         and row["tier_share_pts"] <= BOUNDS["tier_share_pts"]
                         and abs(row["sla_pts"]) <= BOUNDS["sla_pts"])
        out[run] = row
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    costs = overheads(args.overheads)
    live = live_report(args.live)
    sim = simulated(costs)
    keys = ("requests", "accuracy", "p50_ms", "p95_ms", "p99_ms", "sla_attainment",
            "tier_share", "cost_per_1k", "privacy_violations", "lost", "refused")
    result = {"bounds": BOUNDS, "overheads": costs,
              "live": {"runs": {r: {k: live["runs"][r][k] for k in keys} for r in RUNS},
                       "thresholds": live.get("thresholds")},
              "sim": {"runs": {r: {k: sim["runs"][r][k] for k in keys} for r in RUNS},
                      "speed": sim["sim"], "tuning": sim.get("tuning")},
              }
    result["compare"] = compare(result["live"]["runs"], result["sim"]["runs"])
    result["all_within"] = all(r["within"] for r in result["compare"].values())
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


def print_table(result: dict[str, Any]) -> None:
    print(f"HTTP costs: request {result['overheads']['request_ms']} ms, hop "
          f"{result['overheads']['hop_ms']} ms ({result['overheads']['source']})")
    print(f"{'run':<13}{'p50 live/sim':>16}{'p95 live/sim':>16}{'SLA live/sim':>16}"
          f"{'tiers Δpts':>12}{'within':>8}")
    for run in RUNS:
        a, b = result["live"]["runs"][run], result["sim"]["runs"][run]
        c = result["compare"][run]
        print(f"{run:<13}{a['p50_ms']:>8.1f}/{b['p50_ms']:<7.1f}{a['p95_ms']:>8.1f}/"
              f"{b['p95_ms']:<7.1f}{100 * a['sla_attainment']:>8.1f}/"
              f"{100 * b['sla_attainment']:<7.1f}{c['tier_share_pts']:>12.1f}"
              f"{'yes' if c['within'] else 'no':>8}")


if __name__ == "__main__":
    main()
