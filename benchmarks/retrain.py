"""The retraining loop end to end: a fleet collects hard examples from live traffic,
``tierlink retrain`` learns from them, and the new device model is judged, published signed
and canaried — measured on images the loop never saw.

A fleet (2 devices serving ``fmnist-small`` under the demo's cascade threshold, an edge, a
cloud; hard examples kept by the control plane) answers a pool of traffic: the 5,000
Fashion-MNIST training images the zoo holds out of training (``training_holdout``) — half
of the requests carry their label (``tierlink.label``), half do not, whose hard examples
``tierlink retrain`` labels with the cloud model's answer. Then ``run_retrain`` (what the
command runs) fetches the hard examples from the control plane, trains the device model anew
with the zoo's recipe and the hard examples at ``--hard-share`` of the data (the zoo's
trainer, distilled from the cloud model; ``--fine-tune``: fine-tunes the parent instead,
``tierlink retrain``'s default), judges it against its parent on the
test split — disjoint from the pool, from the training data and from the calibration split —
publishes it signed when better and starts a 10% canary on the device tier.

``before`` / ``after``: accuracy on the test split, on its hard slice (the test images the
parent passes up at the fleet's threshold), and the device's share of answers at the fleet's
guarantee (a cascade device > edge > cloud tuned on the calibration split to "accuracy >=
the cloud model's - 0.10 pt with 95% confidence", as the demo's fleet file is). Bounds:
``after.hard_slice_accuracy >= before + 2``, ``after.test_accuracy >= before - 0.3``,
``after.device_share > before``, ``published`` and ``canaried``. Prints a table, writes JSON::

    .venv/bin/python benchmarks/retrain.py [--json PATH] [--rate 50] [--hard-share 0.2]
        [--fine-tune]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tierlink.core.types import Priority, Privacy
from tierlink.fleet.config import parse_fleet
from tierlink.fleet.launcher import RunningFleet, launch
from tierlink.fleet.workload import WorkItem, drive

MODEL, EDGE_MODEL, TEACHER = "fmnist-small", "fmnist-medium", "fmnist-large"
THRESHOLD = 0.9175  # the demo's cascade threshold for its device model
BOUNDS = {"hard_slice_gain_pt": 2.0, "test_accuracy_drop_pt": 0.3}


def fleet_yaml(public_key: str) -> dict[str, Any]:
    return {
        "name": "retrain", "seed": 3, "zoo": {"profile": "full"}, "control": {"ttl_s": 5},
        "trusted_keys": [public_key],
        "routing": {"policy": "tierlink", "thresholds": {MODEL: THRESHOLD,
                                                         EDGE_MODEL: THRESHOLD}},
        "hard_examples": {"sample_rate": 1.0, "max_queue": 5000},
        "nodes": [{"id": "cloud-1", "tier": "cloud", "models": [TEACHER]},
                  {"id": "edge-1", "tier": "edge", "models": [EDGE_MODEL]},
                  {"id": "dev-1", "tier": "device", "models": [MODEL]},
                  {"id": "dev-2", "tier": "device", "models": [MODEL]}],
        "links": [{"from": ["dev-1", "dev-2"], "to": "edge-1", "delay_ms": 2},
                  {"from": "edge-1", "to": "cloud-1", "delay_ms": 10}]}


def pool_traffic(n: int, rate: float) -> list[WorkItem]:
    """Every pool image once, from the two devices in turn, privacy any (a hard example
    may then go to the control plane), generous deadlines (the load is the loop's, not an
    SLA test)."""
    return [WorkItem(i, i, ("dev-1", "dev-2")[i % 2], 2000.0, Priority.BATCH, Privacy.ANY,
                     i / rate) for i in range(n)]


def collect(fleet: RunningFleet, images: np.ndarray, labels: np.ndarray, rate: float,
            http: httpx.Client) -> dict[str, Any]:
    """Drive the pool through the fleet; wait until the control plane holds its hard
    examples (the nodes flush every second)."""
    sent = labels.copy()
    sent[1::2] = -1  # every other request carries no label
    t0 = time.monotonic()
    records = asyncio.run(drive(pool_traffic(len(images), rate), images, sent,
                                fleet.node_urls, "fmnist", None))
    escalated = sum(r.escalations > 0 for r in records)
    deadline = time.monotonic() + 60.0
    stored = 0
    while time.monotonic() < deadline:
        stored = count_stored(fleet, http)
        if stored >= escalated:
            break
        time.sleep(1.0)
    return {"requests": len(records), "answered": sum(r.answered for r in records),
            "escalated": escalated, "hard_examples_stored": stored,
            "seconds": round(time.monotonic() - t0, 1)}


def count_stored(fleet: RunningFleet, http: httpx.Client) -> int:
    """The device model's hard examples the control plane holds (paged through)."""
    count, after = 0, 0
    while True:
        page = http.get(f"{fleet.control_url}/v1/hard-examples",
                        params={"model": MODEL, "limit": 1000, "after_id": after},
                        headers=fleet.admin_headers).json()
        count += len(page["examples"])
        if page.get("next_after_id") is None:
            return count
        after = int(page["next_after_id"])


def device_share(model: Path, temperature: float, others: list[tuple[Path, float]],
                 calib: Any) -> float:
    """The device's share of answers under the fleet's guarantee (module doc)."""
    from tierlink.cascade.guarantee import tune_guaranteed
    from tierlink.cascade.tune import Stage
    from tierlink.core.types import Tier
    from tierlink.models.evaluate import onnx_logits
    from tierlink.models.kinds import softmax

    stages = []
    for (path, t), tier in zip([(model, temperature), *others],
                               (Tier.DEVICE, Tier.EDGE, Tier.CLOUD), strict=True):
        p = softmax(onnx_logits(path, calib.input), t)
        stages.append(Stage(path.parent.name, tier, p.max(axis=1),
                            p.argmax(axis=1) == calib.labels, 0.0))
    return round(float(tune_guaranteed(stages, 0.95, drop=0.001).chosen.shares[0]), 4)


def canaried(fleet: RunningFleet, rollout: int, http: httpx.Client,
             timeout_s: float = 90.0) -> dict[str, Any]:
    """Wait until a device serves the new version (the canary's share), or time out."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = http.get(f"{fleet.control_url}/v1/rollouts/{rollout}",
                          headers=fleet.admin_headers).json()
        nodes = http.get(f"{fleet.control_url}/v1/nodes", headers=fleet.admin_headers).json()
        serving = sorted(n["node_id"] for n in nodes["nodes"] for m in n["models"]
                         if m["name"] == MODEL and m["version"] == "2")
        if serving or time.monotonic() > deadline:
            return {"phase": record["phase"], "serving": serving, "ok": bool(serving)}
        time.sleep(1.0)


def run(work: Path, rate: float, options: dict[str, str]) -> dict[str, Any]:
    from tierlink.cli.models import fleet_models
    from tierlink.cli.retrain import run_retrain
    from tierlink.models.card import load_card
    from tierlink.repo.signing import generate_key
    from tierlink.zoo.datasets import fashion_mnist, training_holdout

    models = fleet_models("full", (MODEL, EDGE_MODEL, TEACHER), progress=True)
    key = work / "publisher.key"
    config = parse_fleet(fleet_yaml(generate_key(key)), source="<retrain benchmark>")
    pool, splits = training_holdout(), fashion_mnist()
    http = httpx.Client(timeout=30.0, trust_env=False)
    fleet = launch(config, models, work / "fleet")
    try:
        traffic = collect(fleet, pool.input, pool.labels, rate, http)
        t0 = time.monotonic()
        outcome = run_retrain(MODEL, examples=None, control=fleet.control_url,
                              teacher=TEACHER, threshold=THRESHOLD, trainer="zoo",
                              options=options, profile="full", max_drop=BOUNDS["test_accuracy_drop_pt"],
                              version="2", key=key, tier="device", canary="10%",
                              out=work / "retrained", admin_token=fleet.admin_token)
        retrain_s = round(time.monotonic() - t0, 1)
        canary = canaried(fleet, outcome["rollout"], http) if outcome["rollout"] else None
    finally:
        fleet.stop()
        http.close()
    parent_card = load_card(models[MODEL][1])
    new_card = load_card(work / "retrained" / "card.json")
    others = [(models[n][0], load_card(models[n][1]).temperature) for n in (EDGE_MODEL,
                                                                             TEACHER)]
    j = outcome["judgement"]
    before = {"test_accuracy": j["parent_accuracy"],
              "hard_slice_accuracy": j["parent_hard_slice_accuracy"],
              "device_share": device_share(models[MODEL][0], parent_card.temperature, others,
                                           splits.calib)}
    after = {"test_accuracy": j["accuracy"], "hard_slice_accuracy": j["hard_slice_accuracy"],
             "device_share": device_share(Path(outcome["file"]), new_card.temperature,
                                          others, splits.calib)}
    return {"before": before, "after": after, "published": outcome["published"],
            "canaried": bool(canary and canary["ok"]), "canary": canary,
            "traffic": traffic, "examples": outcome["examples"],
            "labelled_by_request": outcome["labelled_by_request"],
            "labelled_by_teacher": outcome["labelled_by_teacher"],
            "judgement": j["reason"], "retrain_s": retrain_s, "n_test": j["n"],
            "n_hard_slice": j["n_hard"]}


def judge_bounds(r: dict[str, Any]) -> dict[str, bool]:
    b, a = r["before"], r["after"]
    return {"hard_slice_gain": a["hard_slice_accuracy"] >= b["hard_slice_accuracy"]
            + BOUNDS["hard_slice_gain_pt"],
            "test_accuracy": a["test_accuracy"] >= b["test_accuracy"]
            - BOUNDS["test_accuracy_drop_pt"],
            "device_share": a["device_share"] > b["device_share"],
            "published": bool(r["published"]), "canaried": bool(r["canaried"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--rate", type=float, default=50.0, help="pool requests per second")
    parser.add_argument("--fine-tune", action="store_true",
                        help="fine-tune the parent (tierlink retrain's default, seconds) "
                             "instead of training anew with the zoo's recipe (minutes)")
    parser.add_argument("--hard-share", type=float, default=0.2,
                        help="trained anew: the hard examples' share of the data")
    args = parser.parse_args(argv)
    options = ({} if args.fine_tune
               else {"from_scratch": "true", "hard_share": str(args.hard_share)})
    with tempfile.TemporaryDirectory(prefix="tierlink-retrain-") as tmp:
        result = run(Path(tmp), args.rate, options)
    result["trainer_options"] = options
    met = judge_bounds(result)
    print("| | test accuracy | hard slice | device share at the guarantee |")
    print("|---|---|---|---|")
    for side in ("before", "after"):
        r = result[side]
        print(f"| {side} | {r['test_accuracy']:.2f}% | {r['hard_slice_accuracy']:.2f}% | "
              f"{100 * r['device_share']:.2f}% |")
    print(f"published: {result['published']}, canaried: {result['canaried']}; "
          f"{result['examples']} hard examples ({result['labelled_by_request']} labelled by "
          f"their request, {result['labelled_by_teacher']} by {TEACHER})")
    print("bounds met:", json.dumps(met))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**result, "bounds": BOUNDS, "met": met,
                                         "threshold": THRESHOLD, "rate_per_s": args.rate,
                                         "date": time.strftime("%Y-%m-%d")}, indent=2))
        print(f"wrote {args.json}")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
