"""Does the calibrated cascade pay? Accuracy against cost on a held-out test split.

The chain is the demo fleet's: device model -> edge model -> cloud model (Fashion-MNIST by
default: fmnist-small -> fmnist-medium -> fmnist-large; ``--device-model`` swaps in a
quantized variant such as ``fmnist-small-int8``). Every model's confidence is its max
softmax probability after temperature scaling fitted on the calibration split.

1. ``tierlink cascade tune``'s operating point: thresholds chosen on the calibration split
   so that "accuracy >= cloud-only - ``--accuracy-drop`` points" holds with probability
   ``--confidence`` (of the expected accuracy; of any ``--batch`` requests when given) (a finite-sample test over the calibration
   records, ``cascade/guarantee.py``; ``--confidence 0``: the old point estimate, which
   just meets the target on the calibration split), then evaluated once on the test split.
2. Baselines on test: device-only, edge-only, cloud-only.
4. The guarantee, checked: the calibration and test splits pooled and split at random
   ``--splits`` times into parts of the same sizes; on each, tuned on the first part and
   judged on the second. ``guarantee.held_share`` (the share of splits on which the target
   held on the test part) must be at least the stated confidence.
3. The curve: the device threshold swept over its confidence quantiles (edge threshold as
   tuned), each point against **random escalation at the same per-tier rates** (mean of
   ``--seeds`` draws): the share of requests that leave the device is the same, only the
   choice of which ones differs. A confidence signal that carries no information would
   land on the random curve.

Costs per request follow the fleet cost model (``docs/cost-model.md``): each tier's compute
price times the model's measured batch-1 latency, plus WAN transfer of the input into the
cloud; a request pays every tier it reaches. Prints a table, writes JSON and a PNG::

    .venv/bin/python benchmarks/cascade.py [--json PATH] [--png PATH] [--task fmnist|mnist]
        [--profile full|test] [--device-model NAME] [--accuracy-drop 0.3]
        [--confidence 0.95] [--batch N] [--splits 50]

Expectation (issue 3): within 0.3 point of cloud-only, >= 85% answered on the device, cost
<= 15% of cloud-only, with a device model >= 1 point less accurate than the cloud model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.cascade.report import Goal, TuneReport, tune_chain, tune_stages
from tierlink.cascade.stages import Chain, build_stages
from tierlink.cascade.tune import Operating, Stage, evaluate, evaluate_assignment, single
from tierlink.core.types import Tier
from tierlink.models.catalog import Catalog, SourceOptions

TIERS = (Tier.DEVICE, Tier.EDGE, Tier.CLOUD)
CURVE_POINTS = 40


def random_assignment(shares: tuple[float, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    """Answering stage per input, drawn at random with the given per-stage shares."""
    counts = np.round(np.asarray(shares) * n).astype(int)
    counts[-1] = n - counts[:-1].sum()
    at = np.repeat(np.arange(len(shares)), counts)
    return rng.permutation(at)


def random_at_same_rates(stages: list[Stage], op: Operating, seeds: int) -> Operating:
    """Mean accuracy and cost of random escalation with ``op``'s per-tier shares."""
    n = len(stages[0].correct)
    runs = [evaluate_assignment(stages, random_assignment(op.shares, n,
                                                           np.random.default_rng(seed)))
            for seed in range(seeds)]
    return Operating((), float(np.mean([r.accuracy for r in runs])),
                     float(np.mean([r.cost for r in runs])), runs[0].shares)


def curve(stages: list[Stage], edge_threshold: float, seeds: int) -> list[dict[str, Any]]:
    """Device threshold swept over quantiles of device confidence, with random escalation
    at the same rates beside each point."""
    grid = np.unique(np.round(np.quantile(stages[0].confidence,
                                          np.linspace(0.0, 0.6, CURVE_POINTS)), 4))
    points = []
    for t in grid:
        op = evaluate(stages, (float(t), edge_threshold))
        rnd = random_at_same_rates(stages, op, seeds)
        points.append({"device_threshold": float(t), "edge_threshold": edge_threshold,
                       "accuracy": op.accuracy, "cost_per_1k": 1000 * op.cost,
                       "device_share": op.shares[0], "edge_share": op.shares[1],
                       "cloud_share": op.shares[2], "random_accuracy": rnd.accuracy,
                       "random_cost_per_1k": 1000 * rnd.cost})
    return points


def summarize(report: TuneReport, test: list[Stage], points: list[dict[str, Any]],
              seeds: int) -> dict[str, Any]:
    chosen = report.test
    cloud, device = single(test, 2), single(test, 0)
    rnd = random_at_same_rates(test, chosen, seeds)
    return {
        "chain": list(report.chain.models),
        "thresholds": report.thresholds(),
        "target": report.describe(),
        "target_met_on_calibration": report.feasible,
        "cloud_only": _point(cloud), "edge_only": _point(single(test, 1)),
        "device_only": _point(device),
        "cascade": {**_point(chosen), "device_share": chosen.shares[0],
                    "edge_share": chosen.shares[1], "cloud_share": chosen.shares[2]},
        "cascade_on_calibration": report.calib.to_dict(),
        "random_same_rates": _point(rnd),
        "checks": {
            "accuracy_gap_points": round(100 * (cloud.accuracy - chosen.accuracy), 3),
            "within_0_3_points": cloud.accuracy - chosen.accuracy <= 0.003 + 1e-12,
            "device_share_at_least_85": chosen.shares[0] >= 0.85,
            "cost_share_of_cloud_only": chosen.cost / cloud.cost,
            "cost_at_most_15_percent": chosen.cost <= 0.15 * cloud.cost,
            "device_model_gap_points": round(100 * (cloud.accuracy - device.accuracy), 3),
            "device_model_at_least_1_point_worse": cloud.accuracy - device.accuracy >= 0.01,
        },
        "curve": points,
    }


def guarantee_check(calib: list[Stage], test: list[Stage], chain: Chain, goal: Goal,
                    splits: int, seed: int = 0) -> dict[str, Any]:
    """Tune on random calibration parts, judge on the rest: how often the target held."""
    pool = [Stage(c.model, c.tier, np.concatenate([c.confidence, t.confidence]),
                  np.concatenate([c.correct, t.correct]), c.cost)
            for c, t in zip(calib, test, strict=True)]
    n, n_cal = len(pool[0].correct), len(calib[0].correct)
    rng = np.random.default_rng(seed)
    held, device, margins = [], [], []
    for _ in range(splits):
        order = rng.permutation(n)
        part = [_subset(pool, order[:n_cal]), _subset(pool, order[n_cal:])]
        report = tune_stages(part[0], part[1], chain, goal)
        gap = single(part[1], len(pool) - 1).accuracy - report.test.accuracy
        held.append(gap <= goal.value / 100.0 + 1e-12)
        device.append(report.test.shares[0])
        margins.append(100 * gap)
    confidence = goal.confidence or 0.0
    return {"confidence": confidence, "splits": splits, "held_share": float(np.mean(held)),
            "target": f"accuracy >= cloud-only - {goal.value} pt"
                      + (f" on any {goal.batch:,} requests" if goal.batch else ""),
            "calib_size": n_cal, "test_size": n - n_cal,
            "device_share_mean": float(np.mean(device)),
            "device_share_min": float(np.min(device)),
            "loss_points_mean": float(np.mean(margins)),
            "loss_points_max": float(np.max(margins)),
            "checks": {"held_at_least_confidence": float(np.mean(held)) >= confidence,
                       "device_share_at_least_85": float(np.mean(device)) >= 0.85}}


def _subset(stages: list[Stage], idx: np.ndarray) -> list[Stage]:
    return [Stage(s.model, s.tier, s.confidence[idx], s.correct[idx], s.cost) for s in stages]


def _point(op: Operating) -> dict[str, float]:
    return {"accuracy": op.accuracy, "cost_per_1k": 1000 * op.cost}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cloud_cost = result["cloud_only"]["cost_per_1k"]
    pts = result["curve"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([100 * p["cost_per_1k"] / cloud_cost for p in pts],
            [100 * p["accuracy"] for p in pts], "o-", ms=3, label="calibrated cascade")
    ax.plot([100 * p["random_cost_per_1k"] / cloud_cost for p in pts],
            [100 * p["random_accuracy"] for p in pts], "x--", ms=3,
            label="random escalation, same rates")
    for key, marker in (("device_only", "v"), ("edge_only", "s"), ("cloud_only", "^")):
        p = result[key]
        ax.plot(100 * p["cost_per_1k"] / cloud_cost, 100 * p["accuracy"], marker, ms=9,
                label=key.replace("_", "-"))
    c = result["cascade"]
    ax.plot(100 * c["cost_per_1k"] / cloud_cost, 100 * c["accuracy"], "*", ms=15,
            label=f"cascade tune ({100 * c['device_share']:.0f}% on device)")
    ax.axhline(100 * result["cloud_only"]["accuracy"] - 0.3, color="grey", lw=0.8, ls=":",
               label="cloud-only - 0.3 pt")
    ax.set_xlabel("cost, % of cloud-only")
    ax.set_ylabel("test accuracy, %")
    ax.set_title(" -> ".join(result["chain"]))
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cloud_cost = result["cloud_only"]["cost_per_1k"]
    table = Table(title=f"cascade {' -> '.join(result['chain'])} (test split)")
    for col in ("run", "accuracy", "cost / 1k req", "% of cloud cost", "device/edge/cloud"):
        table.add_column(col)
    rows = [("device-only", result["device_only"], "100/0/0"),
            ("edge-only", result["edge_only"], "0/100/0"),
            ("cloud-only", result["cloud_only"], "0/0/100"),
            ("random, same rates", result["random_same_rates"], ""),
            ("cascade (tuned)", result["cascade"],
             "/".join(f"{100 * result['cascade'][k]:.1f}"
                      for k in ("device_share", "edge_share", "cloud_share")))]
    for name, p, shares in rows:
        table.add_row(name, f"{100 * p['accuracy']:.2f}%", f"${p['cost_per_1k']:.6f}",
                      f"{100 * p['cost_per_1k'] / cloud_cost:.1f}%", shares)
    console = Console()
    console.print(table)
    console.print(f"thresholds {result['thresholds']} ({result['target']}, "
                  f"met on calibration: {result['target_met_on_calibration']})")
    console.print({k: v for k, v in result["checks"].items()})
    g = result["guarantee"]
    console.print(f"guarantee ({g['target']}, {100 * g['confidence']:g}% confidence): held "
                  f"on {100 * g['held_share']:.0f}% of {g['splits']} random "
                  f"{g['calib_size']}/{g['test_size']} calibration/test splits; answered on "
                  f"the device {100 * g['device_share_mean']:.1f}% on average (min "
                  f"{100 * g['device_share_min']:.1f}%); {g['checks']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--png", type=Path, help="write the accuracy-cost plot here")
    parser.add_argument("--task", default="fmnist", help="fmnist or mnist")
    parser.add_argument("--profile", default="full", help="zoo profile: full or test")
    parser.add_argument("--device-model", help="device model (default: <task>-small)")
    parser.add_argument("--accuracy-drop", type=float, default=0.3,
                        help="points below cloud-only the tuned cascade may lose")
    parser.add_argument("--seeds", type=int, default=20, help="random-escalation draws")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help="the target holds with this probability (0: point estimate)")
    parser.add_argument("--batch", type=int, default=0,
                        help="... on any this many requests (0: the expected accuracy)")
    parser.add_argument("--splits", type=int, default=50,
                        help="random calibration/test splits the guarantee is checked on")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    catalog = Catalog.default(SourceOptions(profile=args.profile,
                                            progress=sys.stderr.isatty()))
    device = args.device_model or f"{args.task}-small"
    chain = Chain((device, f"{args.task}-medium", f"{args.task}-large"), TIERS)
    zoo = catalog.resolve(chain.models)  # a quantized device variant is made on first use
    splits = catalog.data(args.task)
    goal = Goal("accuracy_drop", args.accuracy_drop, confidence=args.confidence or None,
                batch=args.batch or None)
    report = tune_chain(zoo, chain, splits, goal)
    calib, test = build_stages(zoo, chain, splits.calib), build_stages(zoo, chain, splits.test)
    points = curve(test, report.calib.thresholds[1], args.seeds)
    result = summarize(report, test, points, args.seeds)
    result["guarantee"] = guarantee_check(calib, test, chain, goal, args.splits)
    result["environment"] = {"task": args.task, "profile": args.profile,
                             "calib_samples": len(splits.calib),
                             "test_samples": len(splits.test),
                             "command": "benchmarks/cascade.py " + " ".join(sys.argv[1:])}
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot(result, args.png)


if __name__ == "__main__":
    main()
