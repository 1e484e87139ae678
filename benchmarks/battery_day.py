"""A day on batteries: what sparing a low or hot device's compute does to its battery life
and to SLA attainment.

``tierlink sim`` on the demo's fleet with ``examples/sim-battery-day.yaml`` (a diurnal day
of requests; each device a battery that drains while idle and while computing, and a chip
that heats up with work and throttles when hot), twice: with the fleet's
``routing.device_state`` rule (a battery at or under 20% and not charging, or ``serious``
heat: requests go upstream where one can answer in time) and with it off (``low_battery:
0, hot: none``); ``device_only`` beside them. Reported per variant: when the first device's
battery went flat (``first_empty_s``), the devices' charge at the end, the seconds they ran
throttled (all devices together) and the hottest any got, SLA attainment, accuracy,
requests lost or refused, the share answered on devices; a PNG of the batteries' mean
charge over the day.

    .venv/bin/python benchmarks/battery_day.py [--json PATH] [--png PATH]
        [--scenario examples/sim-battery-day.yaml] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "src/tierlink/demo/fleets/fleet.yaml"
SCENARIO = ROOT / "examples/sim-battery-day.yaml"
OFF = {"low_battery": 0.0, "hot": "none"}


def variant(fleet_text: str, rule: dict[str, Any] | None, where: Path) -> Path:
    """The demo's fleet file with ``routing.device_state`` set to ``rule`` (None: as is)."""
    raw = yaml.safe_load(fleet_text)
    if rule is not None:
        raw["routing"]["device_state"] = rule
    where.write_text(yaml.safe_dump(raw, sort_keys=False))
    return where


def summary(report: dict[str, Any], run: str) -> dict[str, Any]:
    power, result = report["sim"][run]["power"], report["runs"][run]
    return {"first_empty_h": None if power["first_empty_s"] is None
            else round(power["first_empty_s"] / 3600, 2),
            "devices_flat": len(power["empty"]), "devices": power["devices"],
            "mean_charge_at_end": power["mean_charge_share"],
            "min_charge_at_end": power["min_charge_share"],
            "throttled_h": round(power["throttled_s"] / 3600, 2),
            "peak_heat": power["peak_heat"],
            "sla_attainment": round(result["sla_attainment"], 4),
            "accuracy": round(result["accuracy"], 4),
            "lost": result["lost"], "refused": result["refused"],
            "device_share": round(result["tier_share"].get("device", 0.0), 4),
            "timeline": power["timeline"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tierlink.cli.sim import run_sim

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tierlink-battery-") as tmp:
        for name, rule, runs in (("tierlink", None, "tierlink,device_only"),
                                 ("tierlink_rule_off", OFF, "tierlink")):
            fleet = variant(FLEET.read_text(), rule, Path(tmp) / f"{name}.yaml")
            report = run_sim(fleet, scenario_file=args.scenario, requests=None, rate=25.0,
                             arrivals=None, duration_s=None, seed=args.seed, runs=runs,
                             json_path=None, png_path=None, photos=False)
            out[name] = summary(report, "tierlink")
            if "device_only" in runs:
                out["device_only"] = summary(report, "device_only")
    return {"variants": out, "scenario": str(args.scenario.relative_to(ROOT))
            if args.scenario.is_relative_to(ROOT) else str(args.scenario),
            "rule": {"on": "routing.device_state defaults (low_battery 0.2, hot serious)",
                     "off": OFF}, "seed": args.seed}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tierlink.sim.plots import battery_panel

    fig, ax = plt.subplots(figsize=(9, 4))
    battery_panel(ax, {name: v["timeline"] for name, v in result["variants"].items()},
                  hours=True)
    ax.axhline(0.2, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("simulated hours")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(result: dict[str, Any]) -> None:
    keys = ("first_empty_h", "devices_flat", "mean_charge_at_end", "throttled_h", "peak_heat",
            "sla_attainment", "accuracy", "lost", "refused", "device_share")
    print(f"{'variant':20}" + "".join(f"{k:>19}" for k in keys))
    for name, v in result["variants"].items():
        print(f"{name:20}" + "".join(f"{v[k]!s:>19}" for k in keys))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.png:
        plot(result, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
