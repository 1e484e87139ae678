"""Where cascade thresholds are calibrated matters: training-set hold-out against test images.

The demo's cascade (fmnist-small-fp16 -> fmnist-medium -> fmnist-large) tuned for the demo
fleet's target ("accuracy >= cloud-only - 0.1 pt with 95% confidence", ``cascade tune``'s
finite-sample guarantee) on two calibration sets of 5,000 images, and judged on the same
5,000 test images (the zoo's test split, where the demo's requests come from):

* ``train_holdout``: 5,000 official *training* images held out of training — the zoo's
  calibration split until the change this benchmark justifies;
* ``test_calib``: 5,000 official *test* images (the zoo's calibration split now), disjoint
  from the test split.

Each arm fits its own temperatures on its own calibration set. Reported per arm: the bar,
how many calibration inputs the cascade loses or wins against the cloud model at that bar
(its discordances, which the guarantee's test counts), the same on the test split, the
accuracy gap and escalation on the test split, and the share of random slices of
``--slice`` test requests (the size of the demo's "any, cloud reachable" slice) on which the
cascade stays within 0.5 point of cloud-only. Also the discordance above one common bar
(0.885) on each set, per 5,000 inputs::

    .venv/bin/python benchmarks/calibration_shift.py [--json PATH] [--slices 4000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.cascade.guarantee import tune_guaranteed
from tierlink.cascade.tune import Stage, answering_stage, answers_correct, evaluate
from tierlink.core.types import Tier
from tierlink.models.calibration import fit_temperature
from tierlink.models.catalog import Catalog, SourceOptions
from tierlink.models.data import Labelled
from tierlink.models.evaluate import onnx_logits, softmax
from tierlink.zoo.datasets import fashion_mnist, training_holdout

CHAIN = ("fmnist-small-fp16", "fmnist-medium", "fmnist-large")
TIERS = (Tier.DEVICE, Tier.EDGE, Tier.CLOUD)
DROP, CONFIDENCE = 0.001, 0.95  # the demo fleet's target (demo/fleets/fleet.yaml)
COMMON_BAR = 0.885  # the bar the train hold-out chose for the demo's models


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--slices", type=int, default=4000, help="random test slices drawn")
    p.add_argument("--slice", type=int, default=195, help="requests per slice")
    return p.parse_args(argv)


def stages_for(paths: dict[str, Path], fit: Labelled, judge: Labelled) -> tuple[list[Stage], ...]:
    """Stages on ``fit`` and on ``judge``, each model's temperature fitted on ``fit``."""
    out: tuple[list[Stage], list[Stage]] = ([], [])
    for (name, path), tier in zip(paths.items(), TIERS, strict=True):
        logits = {"fit": onnx_logits(path, fit.input), "judge": onnx_logits(path, judge.input)}
        t = fit_temperature(logits["fit"], fit.labels)
        for part, split, stages in (("fit", fit, out[0]), ("judge", judge, out[1])):
            probs = softmax(logits[part], t)
            stages.append(Stage(name, tier, probs.max(axis=1),
                                probs.argmax(axis=1) == split.labels, 0.0))
    return out


def cascade_right(stages: list[Stage], bar: float) -> np.ndarray:
    """(N,) whether the cascade's answer is right with ``bar`` at every stage but the last."""
    bars = [bar] * (len(stages) - 1)
    return answers_correct(stages, answering_stage(stages, bars))


def discord(stages: list[Stage], bar: float) -> dict[str, int]:
    """Inputs the cascade at ``bar`` gets wrong where the cloud model is right (lost) and
    the other way round (won)."""
    right, top = cascade_right(stages, bar), stages[-1].correct
    return {"lost": int((~right & top).sum()), "won": int((right & ~top).sum())}


def slice_share(stages: list[Stage], bar: float, size: int, draws: int) -> float:
    """Share of random ``size``-request slices on which the cascade is within 0.5 point."""
    diff = cascade_right(stages, bar).astype(int) - stages[-1].correct.astype(int)
    rng = np.random.default_rng(0)
    ok = [diff[rng.choice(len(diff), size, replace=False)].sum() >= -0.005 * size
          for _ in range(draws)]
    return float(np.mean(ok))


def per_5k(counts: dict[str, int], n: int) -> dict[str, float]:
    return {k: round(v * 5000 / n, 1) for k, v in counts.items()}


def arm(paths: dict[str, Path], calib: Labelled, test: Labelled, args: argparse.Namespace
        ) -> dict[str, Any]:
    fit, judge = stages_for(paths, calib, test)
    tuned = tune_guaranteed(fit, CONFIDENCE, drop=DROP)
    bar = tuned.chosen.thresholds[0]
    on_test = evaluate(judge, tuned.chosen.thresholds)
    top = float(judge[-1].correct.mean())
    return {
        "bar": bar, "guarantee": tuned.guarantee.describe(),
        "calib_discordance": discord(fit, bar), "test_discordance": discord(judge, bar),
        "test_accuracy_gap_pt": round(100 * (on_test.accuracy - top), 3),
        "test_escalated": round(on_test.escalated, 4),
        "test_device_share": round(on_test.shares[0], 4),
        "slices_within_0_5pt": slice_share(judge, bar, args.slice, args.slices),
        "discordance_above_common_bar_per_5k": per_5k(discord(fit, COMMON_BAR), len(calib)),
        "test_discordance_above_common_bar_per_5k": per_5k(discord(judge, COMMON_BAR),
                                                           len(test)),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    found = Catalog.default(SourceOptions(profile="full", progress=False)).resolve(CHAIN)
    paths = {m: found[m].file for m in CHAIN}
    splits = fashion_mnist()
    arms = {"train_holdout": arm(paths, training_holdout(), splits.test, args),
            "test_calib": arm(paths, splits.calib, splits.test, args)}
    return {"chain": list(CHAIN), "target": f"accuracy >= top - {100 * DROP:.2f} pt, "
            f"{100 * CONFIDENCE:g}% confidence", "slice": args.slice, "slices": args.slices,
            "test_samples": len(splits.test), "arms": arms,
            # the test split as the zoo's own temperatures (fitted on test_calib) see it
            "test_discordance_above_common_bar_per_5k":
                arms["test_calib"]["test_discordance_above_common_bar_per_5k"]}


def print_table(result: dict[str, Any]) -> None:
    print(f"{'calibrated on':<15}{'bar':>8}{'calib lost/won':>16}{'test lost/won':>15}"
          f"{'test gap pt':>13}{'escalated':>11}{'slices ok':>11}")
    for name, a in result["arms"].items():
        c, t = a["calib_discordance"], a["test_discordance"]
        print(f"{name:<15}{a['bar']:>8.4f}{c['lost']:>10}/{c['won']:<5}{t['lost']:>9}/"
              f"{t['won']:<5}{a['test_accuracy_gap_pt']:>13.2f}{a['test_escalated']:>11.1%}"
              f"{a['slices_within_0_5pt']:>11.1%}")
    common = {n: a["discordance_above_common_bar_per_5k"] for n, a in result["arms"].items()}
    print(f"discordance above {COMMON_BAR} per 5,000: {common}, test split "
          f"{result['test_discordance_above_common_bar_per_5k']}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
