"""The simulator against the real fleet, judged against the live runs' own spread.

The live demo (``tierlink demo --quick``, its workload seed 7) runs ``--live-runs`` times
(at least three), each with its request log. ``sim`` is ``tierlink sim`` on the demo's
fleet file with no calibration option — the simulator's defaults, HTTP costs included
(``sim/serving_defaults.json``: measured on earlier live runs); ``sim_calibrated`` is the same
with the HTTP costs measured from the first live run's log (``--http-from``). Per policy and
metric the report puts the simulation beside the live runs' median and their spread
(max − min), and a run is ``within`` when, for p50 and p95, |sim − live median| <= live
spread + 10% of the median, every tier share is within 3 points of the median and SLA
attainment within 2 points::

    .venv/bin/python benchmarks/sim_calibration.py [--live-runs 3] [--runs-dir DIR]
        [--json PATH] [--write-defaults]

``--runs-dir`` keeps (or reuses) the live runs: ``demo-7-1.json``/``.jsonl``, ...
``--write-defaults`` stores the HTTP costs all the live runs paid as the simulator's
defaults (``src/tierlink/sim/serving_defaults.json``) before simulating — in-sample then: judge
the defaults on other live runs (another ``--runs-dir``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "src/tierlink/demo/fleets/fleet.yaml"
DEFAULTS = ROOT / "src/tierlink/sim/serving_defaults.json"
BOUNDS = {"latency_spread_plus": 0.10, "tier_share_pts": 3.0, "sla_pts": 2.0}
RUNS = ("tierlink", "static_rules", "cloud_only", "device_only")
SEED = 7  # the demo's workload
KEYS = ("requests", "accuracy", "p50_ms", "p95_ms", "p99_ms", "sla_attainment", "tier_share",
        "cost_per_1k", "privacy_violations", "privacy_refusals", "lost", "refused")
TIERS = ("device", "edge", "cloud")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--live-runs", type=int, default=3)
    p.add_argument("--runs-dir", type=Path, help="where the live runs are kept (default: a "
                                                 "temporary folder; runs missing are made)")
    p.add_argument("--json", type=Path)
    p.add_argument("--write-defaults", action="store_true",
                   help="store the live runs' HTTP costs as the simulator's defaults first")
    args = p.parse_args(argv)
    if args.live_runs < 3:
        p.error("--live-runs must be at least 3: a spread of fewer says too little")
    return args


def live_run(folder: Path, i: int) -> tuple[dict[str, Any], Path]:
    """Live run ``i``'s report and request log (run now if missing)."""
    report, log = folder / f"demo-{SEED}-{i}.json", folder / f"demo-{SEED}-{i}.jsonl"
    if not (report.exists() and log.exists()):
        tierlink = Path(sys.executable).parent / "tierlink"
        subprocess.run([str(tierlink), "demo", "--quick", "--seed", str(SEED), "--json",
                        str(report), "--log", str(log)], check=True)
    return dict(json.loads(report.read_text())), log


def simulated(http_from: Path | None) -> dict[str, Any]:
    """``tierlink sim`` on the demo's fleet file and workload (HTTP costs from
    ``http_from``'s log, or the defaults)."""
    from tierlink.cli.sim import run_sim
    from tierlink.demo.phases import DemoSettings

    settings = DemoSettings.quick()
    return run_sim(FLEET, scenario_file=None, requests=settings.requests,
                   rate=settings.rate_per_s, arrivals=None, duration_s=None, seed=SEED,
                   runs=",".join(RUNS), json_path=None, png_path=None,
                   progress=sys.stderr.isatty(), http_from=http_from)


def figures(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r: {k: report["runs"][r][k] for k in KEYS} for r in RUNS}


def flat(run: dict[str, Any]) -> dict[str, float]:
    """The judged metrics of one run as numbers (tier shares one per tier)."""
    out = {k: float(run[k]) for k in ("p50_ms", "p95_ms", "sla_attainment", "accuracy",
                                       "cost_per_1k")}
    return out | {f"tier_share.{t}": float(run["tier_share"][t]) for t in TIERS}


def median_and_spread(lives: list[dict[str, dict[str, Any]]]
                      ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    median: dict[str, dict[str, float]] = {}
    spread: dict[str, dict[str, float]] = {}
    for r in RUNS:
        values = [flat(live[r]) for live in lives]
        median[r] = {k: round(statistics.median(v[k] for v in values), 6) for k in values[0]}
        spread[r] = {k: round(max(v[k] for v in values) - min(v[k] for v in values), 6)
                     for k in values[0]}
    return median, spread


def within(sim: dict[str, dict[str, Any]], median: dict[str, dict[str, float]],
           spread: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in RUNS:
        s, m, w = flat(sim[r]), median[r], spread[r]
        row: dict[str, Any] = {}
        for k in ("p50_ms", "p95_ms"):
            allowed = w[k] + BOUNDS["latency_spread_plus"] * m[k]
            row[k] = {"sim": round(s[k], 3), "off": round(s[k] - m[k], 3),
                      "allowed": round(allowed, 3), "ok": abs(s[k] - m[k]) <= allowed}
        tiers = max(abs(100 * (s[f"tier_share.{t}"] - m[f"tier_share.{t}"])) for t in TIERS)
        sla = 100 * (s["sla_attainment"] - m["sla_attainment"])
        row["tier_share_pts"] = {"off": round(tiers, 2), "ok": tiers <= BOUNDS["tier_share_pts"]}
        row["sla_pts"] = {"off": round(sla, 2), "ok": abs(sla) <= BOUNDS["sla_pts"]}
        row["cost_per_1k_rel"] = round(s["cost_per_1k"] / m["cost_per_1k"] - 1.0, 4) \
            if m["cost_per_1k"] else None
        row["within"] = all(row[k]["ok"] for k in ("p50_ms", "p95_ms", "tier_share_pts",
                                                    "sla_pts"))
        out[r] = row
    return out


def write_defaults(logs: list[Path]) -> dict[str, Any]:
    """The HTTP costs every live run paid, stored as the simulator's defaults."""
    from tierlink.fleet.config import load_fleet
    from tierlink.fleet.requestlog import measured, read_runs
    from tierlink.sim.http import costs_by_run
    from tierlink.sim.http import write_defaults as store
    from tierlink.sim.outcomes import model_outcomes

    config = load_fleet(FLEET)
    input_bytes = model_outcomes("fmnist", ["fmnist-small"], config.zoo_profile).input_bytes
    runs: dict[str, list[Any]] = {}
    for log in logs:
        for name, entries in measured(read_runs(log)).items():
            runs.setdefault(name, []).extend(entries)
    pooled, own = costs_by_run(runs, config, input_bytes)
    overhead = compute_overhead([e for entries in runs.values() for e in entries], config)
    provenance = {"measured": time.strftime("%Y-%m-%d"), "fleet": "the demo's (quick)",
                  "live_runs": len(logs), "machine": "2 cores, no accelerator",
                  "command": "benchmarks/sim_calibration.py --write-defaults"}
    store(DEFAULTS, pooled, own, provenance, overhead)
    return {"written": str(DEFAULTS.relative_to(ROOT)), **provenance,
            "request_ms": pooled.summary()["request_ms"], "hop_ms": pooled.summary()["hop_ms"],
            "compute_overhead_ms": round(overhead, 4)}


def compute_overhead(entries: list[Any], config: Any) -> float:
    """A model run's cost beyond its card: the devices' own answers' compute time less the
    card's latency at the device's speed (its CPU quota), the median."""
    from tierlink.models.catalog import Catalog, SourceOptions
    from tierlink.models.runtime import ModelInfo

    devices = {n.node_id: n for n in config.nodes if n.tier.label == "device"}
    names = tuple(dict.fromkeys(n.models[0] for n in devices.values() if n.models))
    catalog = Catalog.default(SourceOptions(profile=config.zoo_profile, progress=False))
    card = {name: ModelInfo.from_card(paths[1]).latency_ms
            for name, paths in catalog.paths(names).items()}
    samples = [e.timings["compute_ms"] - card[devices[e.served_by].models[0]]
               / (devices[e.served_by].cpu_quota or 1.0)
               for e in entries if e.answered and e.served_by == e.item.origin
               and e.served_by in devices and "compute_ms" in e.timings]
    return max(0.0, statistics.median(samples)) if samples else 0.0


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    folder = args.runs_dir or Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    lives = [live_run(folder, i) for i in range(1, args.live_runs + 1)]
    result: dict[str, Any] = {"bounds": BOUNDS, "seed": SEED}
    if args.write_defaults:
        result["defaults_written"] = write_defaults([log for _, log in lives])
    live_runs = [figures(report) for report, _ in lives]
    median, spread = median_and_spread(live_runs)
    sim, calibrated = simulated(None), simulated(lives[0][1])
    result |= {"live_runs": live_runs, "live_median": median, "live_spread": spread,
               "sim": figures(sim), "sim_http": sim["http"],
               "sim_calibrated": figures(calibrated), "sim_calibrated_http": calibrated["http"]}
    result["within"] = within(result["sim"], median, spread)
    result["within_calibrated"] = within(result["sim_calibrated"], median, spread)
    result["all_within"] = all(r["within"] for r in result["within"].values())
    result["all_within_calibrated"] = all(r["within"]
                                          for r in result["within_calibrated"].values())
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


def print_table(result: dict[str, Any]) -> None:
    n = len(result["live_runs"])
    print(f"{n} live runs (median, spread) against `tierlink sim` with its defaults "
          "(and calibrated on the first run's log)")
    print(f"{'run':<13}{'p50 live (spread) / sim / cal':>34}{'p95 live (spread) / sim / cal':>34}"
          f"{'SLA Δpts':>10}{'tiers Δpts':>12}{'within':>8}")
    for r in RUNS:
        m, w = result["live_median"][r], result["live_spread"][r]
        a, b = result["within"][r], result["within_calibrated"][r]
        lat = [f"{m[k]:6.1f} ({w[k]:4.1f}) / {a[k]['sim']:5.1f} / {b[k]['sim']:5.1f}"
               for k in ("p50_ms", "p95_ms")]
        print(f"{r:<13}{lat[0]:>34}{lat[1]:>34}{a['sla_pts']['off']:>10.2f}"
              f"{a['tier_share_pts']['off']:>12.2f}{'yes' if a['within'] else 'no':>8}")
    print(f"defaults within the live spread bounds: {result['all_within']}; calibrated: "
          f"{result['all_within_calibrated']}")


if __name__ == "__main__":
    main()
