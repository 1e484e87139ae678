"""Drift against the best model: a device version confidently wrong on one class, caught by
agreement with the most capable model — no labels — and rolled back at the demo's load.

Each run starts the demo's fleet (``src/tierlink/demo/fleets/fleet.yaml``: 4 devices at half
a core, 2 edges, a cloud, its links and routing; without the photo model, which this load
does not use) with mirroring on (``routing.mirror.share``, 5% by default), drives the demo's
Fashion-MNIST load (25 requests/s, its SLA and privacy mix) **without labels**, publishes a
new version of the devices' model signed, and rolls it out to the device tier (stages 50%,
100%; the default gates, fail fast) a little after the load began:

* ``broken``: the same weights answering class ``--wrong-class`` (Trouser) as
  ``--as-class`` (Dress) just as confidently (``tierlink.testing.artifacts.relabeled_copy``):
  its confidence histogram, escalation rate and latency are the healthy version's; only the
  ``agreement`` gate can see it. Bounds: ``detected_after_s <= 300`` (from the rollout's
  start to its rollback), ``rolled_back``, ``lost == 0``, ``mirror_share <= 0.05``.
* ``healthy``: the FP32 model the devices' FP16 one was made from, as a new version: it
  must not be rolled back (``false_rollback == false``).

``exposed_share``: the share of the run's requests (from the rollout's start) the broken
version answered; ``mirror_share``: mirrors sent / answers the devices' and edges' own models
gave. Prints a table, writes JSON::

    .venv/bin/python benchmarks/drift.py [--json PATH] [--seconds 330] [--share 0.05]
        [--runs broken,healthy]

Every process it starts is stopped at the end of its run (the fleet's context manager).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from faults import Load  # the fault suite's load thread (benchmarks/ is on sys.path)

from tierlink.fleet.config import parse_fleet
from tierlink.fleet.launcher import RunningFleet, launch
from tierlink.fleet.workload import make_workload

DEMO_FLEET = Path(__file__).resolve().parents[1] / "src/tierlink/demo/fleets/fleet.yaml"
MODEL = "fmnist-small-fp16"  # what the demo's devices serve
PHOTO = "imagenet-mobilenetv2"
RATE = 25.0  # the demo's requests/s (DemoSettings)
ROLLOUT_AT_S = 20.0  # into the load: the baseline version has answered a while
BOUNDS = {"detected_after_s": 300.0, "mirror_share": 0.05}


@dataclass
class Bench:
    work: Path
    seconds: float
    share: float
    wrong_class: int
    as_class: int
    models: dict[str, tuple[Path, Path]]
    images: np.ndarray
    labels: np.ndarray
    http: httpx.Client


def fleet_yaml(bench: Bench, name: str, public_key: str) -> dict[str, Any]:
    """The demo's fleet, its photo model left out, mirroring on, the publisher trusted."""
    raw = yaml.safe_load(DEMO_FLEET.read_text())
    raw["name"] = f"drift-{name}"
    raw["trusted_keys"] = [public_key]
    raw["routing"]["mirror"] = {"share": bench.share}
    for node in raw["nodes"]:
        node["models"] = [m for m in node["models"] if m != PHOTO]
        node.pop("heads", None)
    return raw


def make_version(bench: Bench, kind: str) -> Path:
    from tierlink.testing.artifacts import relabeled_copy

    if kind == "healthy":
        return bench.models["fmnist-small"][0]
    return relabeled_copy(bench.models[MODEL][0], bench.work / f"{MODEL}-broken.onnx",
                          bench.wrong_class, bench.as_class)


def run_once(bench: Bench, kind: str) -> dict[str, Any]:
    from tierlink.cli.model import run_publish
    from tierlink.repo.signing import generate_key

    key_file = bench.work / f"{kind}.key"
    public = generate_key(key_file)
    version = f"2-{kind}"
    config = parse_fleet(fleet_yaml(bench, kind, public), source=f"<drift {kind}>")
    devices = [n.node_id for n in config.nodes if n.tier.label == "device"]
    items = make_workload(int(RATE * bench.seconds), RATE, devices, len(bench.images), seed=7)
    fleet = launch(config, {n: bench.models[n] for n in config.model_names()},
                   bench.work / kind)
    try:
        run_publish(MODEL, make_version(bench, kind), bench.models[MODEL][1], version,
                    f"drift benchmark: {kind}", key_file, fleet.control_url, eval_limit=1000,
                    admin_token=fleet.admin_token)
        load = Load(bench, items, fleet.node_urls, send_labels=False)
        load.start()
        while time.monotonic() < load.started + ROLLOUT_AT_S:
            time.sleep(0.05)
        started = time.monotonic()
        rollout = post_rollout(bench, fleet, version)
        record, ended = watch(bench, fleet, rollout["id"], load.started + bench.seconds)
        records = load.finish(timeout_s=bench.seconds + 120.0)
        mirrors = mirror_counts(bench, fleet)
    finally:
        fleet.stop()
    start_s = started - load.started
    during = [r for r in records if r.item.at_s >= start_s]
    exposed = sum(r.model_version == version and r.served_by in devices for r in during)
    own = sum(r.answered and r.tier in ("device", "edge") for r in records)
    sent = sum(v for k, v in mirrors["outcomes"].items()
               if k in ("compared", "failed", "incomparable"))
    rolled_back = record["phase"] == "rolled_back"
    return {
        "version": version, "phase": record["phase"], "reason": last_reason(record),
        "rolled_back": rolled_back,
        "detected_after_s": round(ended - started, 1) if rolled_back else None,
        "exposed_share": round(exposed / max(1, len(during)), 4),
        "exposed_requests": exposed, "requests": len(records),
        "lost": sum(r.lost for r in records),
        "refused": sum(not r.answered and not r.lost for r in records),
        "mirror_share": round(sent / max(1, own), 4), "mirrors_sent": sent,
        "own_answers": own, "mirrors": mirrors,
        "agreement": agreement_verdict(record),
    }


def post_rollout(bench: Bench, fleet: RunningFleet, version: str) -> dict[str, Any]:
    body = {"name": MODEL, "version": version, "tier": "device", "stages": [0.5, 1.0],
            "soak_s": 150.0, "min_requests": 100}
    response = bench.http.post(f"{fleet.control_url}/v1/rollouts", json=body,
                               headers=fleet.admin_headers)
    response.raise_for_status()
    return dict(response.json())


def watch(bench: Bench, fleet: RunningFleet, rollout_id: int,
          until: float) -> tuple[dict[str, Any], float]:
    """Poll the rollout until it ends or the load does; its last record and when it ended
    (monotonic)."""
    while True:
        record = dict(bench.http.get(f"{fleet.control_url}/v1/rollouts/{rollout_id}",
                                     headers=fleet.admin_headers).json())
        now = time.monotonic()
        if record["phase"] in ("rolled_back", "promoted", "failed") or now > until:
            return record, now
        time.sleep(0.25)


def last_reason(record: dict[str, Any]) -> str:
    transitions = record.get("transitions") or []
    return str(transitions[-1].get("reason", "")) if transitions else ""


def agreement_verdict(record: dict[str, Any]) -> dict[str, Any] | None:
    """The agreement gate's last verdict: the new version's figure against the baseline's."""
    verdicts = list(record.get("verdicts") or [])
    for transition in reversed(record.get("transitions") or []):
        verdicts += transition.get("verdicts") or []
    for v in verdicts:
        if v.get("gate") == "agreement":
            return {"outcome": v["outcome"], "value": v["value"], "baseline": v["baseline"],
                    "mirrored": v["n"], "reason": v["reason"]}
    return None


def mirror_counts(bench: Bench, fleet: RunningFleet) -> dict[str, Any]:
    """What every node's mirrors did, and the samples compared per version, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    outcomes: dict[str, float] = {}
    samples: dict[str, list[float]] = {}
    for url in fleet.node_urls.values():
        text = bench.http.get(f"{url}/metrics").text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "tierlink_mirrors_total":
                    outcomes[s.labels["outcome"]] = outcomes.get(s.labels["outcome"], 0) \
                        + s.value
                elif s.name in ("tierlink_mirrored_samples_total",
                                "tierlink_mirror_agreed_samples_total"):
                    key = f"{s.labels['model']}@{s.labels['version']}"
                    pair = samples.setdefault(key, [0.0, 0.0])
                    pair[s.name == "tierlink_mirror_agreed_samples_total"] += s.value
    return {"outcomes": {k: int(v) for k, v in sorted(outcomes.items())},
            "agreement": {k: {"mirrored": int(n), "agreed": int(a),
                              "agreement": round(a / n, 4) if n else None}
                          for k, (n, a) in sorted(samples.items())}}


def load_bench(work: Path, seconds: float, share: float, wrong: int, as_class: int) -> Bench:
    from tierlink.cli.models import fleet_models
    from tierlink.zoo.datasets import fashion_mnist

    models = fleet_models("full", (MODEL, "fmnist-small", "fmnist-medium", "fmnist-large"),
                          progress=True)
    test = fashion_mnist().test
    return Bench(work, seconds, share, wrong, as_class, models, test.input, test.labels,
                 httpx.Client(timeout=10.0, trust_env=False))


def judge(results: dict[str, Any]) -> dict[str, bool]:
    broken, healthy = results.get("broken"), results.get("healthy")
    met: dict[str, bool] = {}
    if broken is not None and "error" not in broken:
        met["rolled_back"] = bool(broken["rolled_back"])
        met["detected_after_s"] = broken["detected_after_s"] is not None \
            and broken["detected_after_s"] <= BOUNDS["detected_after_s"]
        met["mirror_share"] = broken["mirror_share"] <= BOUNDS["mirror_share"]
    if healthy is not None and "error" not in healthy:
        met["false_rollback"] = not healthy["rolled_back"]
        met["healthy_mirror_share"] = healthy["mirror_share"] <= BOUNDS["mirror_share"]
    met["lost"] = all(r.get("lost", 1) == 0 for r in results.values())
    return met


def table(results: dict[str, Any]) -> str:
    cols = ("phase", "detected_after_s", "exposed_share", "requests", "lost", "mirror_share")
    lines = ["| run | " + " | ".join(cols) + " | agreement (new vs baseline) |",
             "|---" * (len(cols) + 2) + "|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error']} |")
            continue
        a = r.get("agreement") or {}
        shown = (f"{a.get('value')} vs {a.get('baseline')} over {a.get('mirrored')}"
                 if a else "-")
        lines.append(f"| {name} | " + " | ".join(str(r.get(c)) for c in cols)
                     + f" | {shown} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--runs", default="broken,healthy")
    parser.add_argument("--seconds", type=float, default=330.0, help="of load per run")
    parser.add_argument("--share", type=float, default=0.05, help="routing.mirror.share")
    parser.add_argument("--wrong-class", type=int, default=1, help="answered wrongly")
    parser.add_argument("--as-class", type=int, default=3, help="...as this class")
    parser.add_argument("--work", type=Path, default=None,
                        help="keep each run's fleet directory (logs) here")
    args = parser.parse_args(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not set(runs) <= {"broken", "healthy"}:
        parser.error("--runs: broken, healthy")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tierlink-drift-") as tmp:
        bench = load_bench(args.work or Path(tmp), args.seconds, args.share, args.wrong_class,
                           args.as_class)
        for kind in runs:
            print(f"[{kind}] ...", flush=True)
            t0 = time.monotonic()
            try:
                results[kind] = run_once(bench, kind)
            except Exception as exc:  # noqa: BLE001 (one broken run must not hide the other)
                import traceback
                traceback.print_exc()
                results[kind] = {"error": f"{type(exc).__name__}: {exc}"}
            results[kind]["wall_s"] = round(time.monotonic() - t0, 1)
            print(f"[{kind}] {json.dumps(results[kind])}", flush=True)
        bench.http.close()
    met = judge(results)
    print(table(results))
    print("bounds met:", json.dumps(met))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "runs": results, "bounds": BOUNDS, "met": met, "share": args.share,
            "rate_per_s": RATE, "seconds": args.seconds, "wrong_class": args.wrong_class,
            "as_class": args.as_class, "model": MODEL,
            "date": time.strftime("%Y-%m-%d")}, indent=2))
        print(f"wrote {args.json}")
    return 0 if met and all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
