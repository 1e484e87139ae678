"""Bring your own model, end to end: a model family none of the zoo code built, imported with
the CLI, tuned, served on a real fleet, and measured against sending everything to the cloud.

1. ``examples/byo/spam_models.py`` trains the spam-filter family (``spam-tiny`` for devices,
   ``spam-base`` for the edge, ``spam-large`` for the cloud) and writes the held-out mails
   (``--family DIR`` reuses a family already made).
2. ``tierlink model import`` installs each model (a model store of this run's own, under
   ``TIERLINK_HOME``), measured on the held-out mails: the import's wall time is reported.
3. ``tierlink cascade tune`` sets the fleet's thresholds for the file's target.
4. ``examples/byo/fleet.yaml`` runs (control plane, emulated links, throttled devices); the
   held-out mails of the import's *evaluation* part (never used for calibration) are sent
   from the devices, privacy ``any``, a deadline that leaves room for the cloud — once
   routed by tierlink, once with every request sent to the cloud (``cloud_only``).

Prints a table, writes JSON (keys ``models``, ``cloud_only``, ``cascade`` with
``accuracy``, ``device_share``, ``cost_per_1k``, and ``import_s``)::

    .venv/bin/python benchmarks/byo.py [--json PATH] [--family DIR] [--rate 40]
        [--accuracy-drop 0.5] [--confidence 0.95]

Expectation (issue 14): >= 80% answered on the device, within 0.5 point of cloud-only
accuracy, at most 20% of its cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "byo"
FAMILY = (("spam-tiny", "device"), ("spam-base", "edge"), ("spam-large", "cloud"))
TASK = "spam"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--family", type=Path, help="a directory spam_models.py already wrote")
    p.add_argument("--rate", type=float, default=40.0, help="requests per second")
    p.add_argument("--requests", type=int, default=0, help="0 = every evaluation mail")
    p.add_argument("--deadline-ms", type=float, default=1000.0)
    p.add_argument("--accuracy-drop", type=float, default=0.5)
    p.add_argument("--confidence", type=float, default=0.95,
                   help="the cascade's guarantee: holds with this probability")
    p.add_argument("--calib-share", type=float, default=0.67,
                   help="the share of held-out mails that calibrate (the rest evaluate): "
                        "a guarantee's power grows with its calibration records")
    p.add_argument("--keep", type=Path, help="keep the run directory here")
    return p.parse_args(argv)


def cli(*args: str, env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """Run ``tierlink ARGS --json``; its JSON answer and wall seconds."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tierlink.cli.main", *args, "--json"],
                          capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"tierlink {' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout), seconds


def make_family(args: argparse.Namespace, run: Path) -> Path:
    if args.family:
        return args.family
    out = run / "family"
    subprocess.run([sys.executable, str(EXAMPLE / "spam_models.py"), "--out", str(out)],
                   check=True)
    return out


def import_family(family: Path, fleet: Path, calib_share: float, env: dict[str, str]
                  ) -> dict[str, dict[str, Any]]:
    models = {}
    for name, tier in FAMILY:
        card, seconds = cli("model", "import", name, str(family / f"{name}.onnx"),
                            "--task", TASK, "--tier", tier, "--data",
                            str(family / "heldout.npz"), "--fleet", str(fleet),
                            "--calib-share", str(calib_share), env=env)
        models[name] = {"tier": tier, "accuracy": card["test_accuracy"],
                        "calib_accuracy": card["calib_accuracy"],
                        "eval_samples": card["data"]["eval_samples"],
                        "params": card["params"], "size_bytes": card["size_bytes"],
                        "latency_ms_b1_p50": card["latency_ms"]["batch1_p50"],
                        "temperature": card["temperature"], "provider": card["provider"],
                        "import_s": round(seconds, 2)}
        print(f"imported {name}: {100 * card['test_accuracy']:.2f}% in {seconds:.1f} s",
              file=sys.stderr)
    return models


def evaluation_part() -> tuple[np.ndarray, np.ndarray]:
    """The held-out mails of the import's evaluation part: (tokens, labels)."""
    from tierlink.modelstore.store import ModelStore

    parts = ModelStore.default().splits(FAMILY[0][0])
    return parts.test.inputs["tokens"], parts.test.labels


def drive_runs(fleet_file: Path, run: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tierlink.core.types import Priority, Privacy
    from tierlink.fleet.config import load_fleet
    from tierlink.fleet.launcher import launch
    from tierlink.fleet.workload import WorkItem, drive, summarize
    from tierlink.models.catalog import Catalog, SourceOptions

    config = load_fleet(fleet_file)
    catalog = Catalog.default(SourceOptions(profile=config.zoo_profile, progress=False))
    models = catalog.paths(config.model_names())
    x, y = evaluation_part()
    n = args.requests or len(y)
    devices = [node.node_id for node in config.nodes if node.tier.label == "device"]
    items = [WorkItem(i, i % len(y), devices[i % len(devices)], args.deadline_ms,
                      Priority.INTERACTIVE, Privacy.ANY, i / args.rate) for i in range(n)]
    out = {}
    with launch(config, models, run / "fleet", say=lambda m: print(m, file=sys.stderr)) as fleet:
        urls = {d: fleet.node_urls[d] for d in devices}
        for name, policy in (("cascade", None), ("cloud_only", "cloud_only")):
            records = asyncio.run(drive(items, x, y, urls, TASK, policy, send_labels=False,
                                        input_name="tokens"))
            figures = summarize(records)
            out[name] = {"accuracy": figures["accuracy"], "requests": figures["requests"],
                         "lost": figures["lost"], "refused": figures["refused"],
                         "device_share": figures["tier_share"]["device"],
                         "tier_share": figures["tier_share"],
                         "cost_per_1k": figures["cost_per_1k"], "p50_ms": figures["p50_ms"],
                         "p95_ms": figures["p95_ms"], "sla_attainment": figures["sla_attainment"]}
            print(f"{name}: {100 * figures['accuracy']:.2f}%", file=sys.stderr)
    return out


def checks(result: dict[str, Any]) -> dict[str, bool]:
    c, o = result["cascade"], result["cloud_only"]
    return {"device_share_ge_80pct": c["device_share"] >= 0.80,
            "within_0.5pt_of_cloud_only": 100 * (o["accuracy"] - c["accuracy"]) <= 0.5,
            "cost_le_20pct_of_cloud_only": c["cost_per_1k"] <= 0.2 * o["cost_per_1k"],
            "nothing_lost": c["lost"] == 0 and o["lost"] == 0}


def run(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="tierlink-byo-"))
    try:
        env = dict(os.environ, TIERLINK_HOME=str(run_dir / "home"))
        os.environ["TIERLINK_HOME"] = env["TIERLINK_HOME"]  # this process reads the store too
        family = make_family(args, run_dir)
        fleet_file = run_dir / "fleet.yaml"
        shutil.copyfile(EXAMPLE / "fleet.yaml", fleet_file)
        models = import_family(family, fleet_file, args.calib_share, env)
        tuned, tune_s = cli("cascade", "tune", str(fleet_file), "--task", TASK,
                            "--accuracy-drop", str(args.accuracy_drop),
                            "--confidence", str(args.confidence), env=env)
        runs = drive_runs(fleet_file, run_dir, args)
        cascade, cloud = runs["cascade"], runs["cloud_only"]
        result = {
            "models": models, "cloud_only": cloud,
            "cascade": {**cascade, "thresholds": tuned["thresholds"],
                        "guarantee": (tuned.get("guarantee") or {}).get("text"),
                        "offline_eval": tuned["test"],
                        "accuracy_vs_cloud_pt": 100 * (cascade["accuracy"] - cloud["accuracy"]),
                        "cost_share_of_cloud_only": cascade["cost_per_1k"] / cloud["cost_per_1k"]
                        if cloud["cost_per_1k"] else None},
            "import_s": {name: m["import_s"] for name, m in models.items()},
            "tune_s": round(tune_s, 2),
            "environment": {"rate_per_s": args.rate, "deadline_ms": args.deadline_ms,
                            "calib_share": args.calib_share,
                            "accuracy_drop": args.accuracy_drop,
                            "confidence": args.confidence,
                            "family": json.loads((family / "family.json").read_text()),
                            "command": "benchmarks/byo.py " + " ".join(sys.argv[1:])},
        }
        result["checks"] = checks(result)
        return result
    finally:
        if args.keep:
            shutil.copytree(run_dir, args.keep, dirs_exist_ok=True)
        shutil.rmtree(run_dir, ignore_errors=True)


def print_table(result: dict[str, Any]) -> None:
    print(f"{'model':<12} {'tier':<7} {'accuracy':>9} {'params':>11} {'ms b1':>7} {'import s':>9}")
    for name, m in result["models"].items():
        print(f"{name:<12} {m['tier']:<7} {100 * m['accuracy']:>8.2f}% {m['params']:>11,} "
              f"{m['latency_ms_b1_p50']:>7.3f} {m['import_s']:>9.1f}")
    print()
    print(f"{'run':<11} {'accuracy':>9} {'device':>7} {'edge':>6} {'cloud':>6} "
          f"{'$/1k':>10} {'p95 ms':>7} {'lost':>5}")
    for name in ("cascade", "cloud_only"):
        r = result[name]
        s = r["tier_share"]
        print(f"{name:<11} {100 * r['accuracy']:>8.2f}% {100 * s['device']:>6.1f}% "
              f"{100 * s['edge']:>5.1f}% {100 * s['cloud']:>5.1f}% {r['cost_per_1k']:>10.6f} "
              f"{r['p95_ms']:>7.1f} {r['lost']:>5}")
    c = result["cascade"]
    print(f"\ncascade vs cloud_only: {c['accuracy_vs_cloud_pt']:+.2f} pt, cost "
          f"{100 * (c['cost_share_of_cloud_only'] or 0):.1f}%; thresholds {c['thresholds']}")
    print("checks: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}"
                                 for k, v in result["checks"].items()))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
