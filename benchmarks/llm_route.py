"""Routing chat by difficulty: each model's quality, the router's, and its large-model calls.

Labelled prompts built offline: Rotten Tomatoes snippets asked as "positive or negative?",
each model's answer read from the likelihood of the label words (``llm/labelled.py``). The
small model is the device's (SmolLM2 INT8, as the fleet serves it; ``--small``), the large one
the cloud's (SmolLM2 FP32). The prompts split into train (the router's logistic regression on
the small model's prompt state), calibration (the threshold: ``tierlink cascade tune``'s
tuner, for "within 1 point of the large model" and for "at most half the calls") and test
(everything reported). Baseline: routing the same share of prompts to the large model at
random. Scores are cached under ``$TIERLINK_HOME/llm/scores``.

    .venv/bin/python benchmarks/llm_route.py [--json PATH] [--png PATH] [--n 1200]
        [--small int8|q3]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

SPLITS = (0.5, 0.25, 0.25)  # train, calibration, test


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--png", type=Path)
    p.add_argument("--n", type=int, default=1200)
    p.add_argument("--small", default="int8", choices=("int8", "q3"))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def scored(variant: str, n: int, seed: int) -> Any:
    """Label probabilities and prompt features of one model on the first ``n`` prompts."""
    import torch

    from tierlink.llm.draft import fake_quantized, int8_draft
    from tierlink.llm.labelled import Scored, rotten_tomatoes, score
    from tierlink.llm.model import LlamaModel
    from tierlink.llm.text import TextCodec
    from tierlink.llm.weights import install_model, llm_root

    cache = llm_root() / "scores" / f"smollm2-135m-{variant}-rt{seed}-{n}.npz"
    if cache.exists():
        data = np.load(cache)
        return Scored(data["probs"], data["features"]), data["labels"]
    torch.set_num_threads(1)
    directory = install_model("smollm2-135m")
    model = LlamaModel.load(directory)
    if variant == "int8":
        model = int8_draft(model)
    elif variant == "q3":
        model = fake_quantized(model, 3)
    items = rotten_tomatoes(seed)[:n]
    start = time.perf_counter()

    def progress(done: int) -> None:
        if done % 100 == 0:
            rate = done / (time.perf_counter() - start)
            print(f"  {variant}: {done}/{n} prompts ({rate:.1f}/s)", flush=True)
    result = score(model, TextCodec(directory), items, progress=progress)
    labels = np.asarray([it.label for it in items])
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, probs=result.probs, features=result.features, labels=labels)
    return result, labels


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from tierlink.cascade.tune import Target, TargetKind
    from tierlink.chat.router import fit, needs_large, routed_quality, tune_router

    args = parse_args(argv)
    small, labels = scored(args.small, args.n, args.seed)
    large, _ = scored("fp32", args.n, args.seed)
    small_right = small.predictions() == labels
    large_right = large.predictions() == labels
    a, b = int(SPLITS[0] * args.n), int((SPLITS[0] + SPLITS[1]) * args.n)
    train, cal, test = slice(0, a), slice(a, b), slice(b, args.n)
    router = fit(small.features[train], needs_large(small_right[train], large_right[train]))
    large_cal = float(large_right[cal].mean())
    targets = {
        "within_1pt": Target(TargetKind.ACCURACY_FLOOR, large_cal - 0.01),
        "half_the_calls": Target(TargetKind.ESCALATION_BUDGET, 0.5),
    }
    rng = np.random.default_rng(args.seed)
    result: dict[str, Any] = {
        "n": args.n, "splits": {"train": a, "calibration": b - a, "test": args.n - b},
        "models": {f"small ({args.small})": float(small_right[test].mean()),
                   "large (fp32)": float(large_right[test].mean())},
        "small_right_large_wrong_test": float((small_right & ~large_right)[test].mean()),
        "large_right_small_wrong_test": float((large_right & ~small_right)[test].mean()),
        "targets": {}}
    for name, target in targets.items():
        tuned, tuning = tune_router(router, small.features[cal], small_right[cal],
                                    large_right[cal], target)
        q = routed_quality(tuned, small.features[test], small_right[test], large_right[test])
        share = q["large_share"]
        rand = [np.where(rng.random(args.n - b) < share, large_right[test],
                         small_right[test]).mean() for _ in range(200)]
        q.update({"threshold": tuned.threshold, "feasible_on_calibration": tuning.feasible,
                  "random_same_share": float(np.mean(rand)),
                  "gap_to_large_pt": 100 * (q["accuracy"] - q["large_accuracy"])})
        result["targets"][name] = q
    _print(result)
    if args.png:
        _plot(router, small.features[test], small_right[test], large_right[test], args.png)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


def _print(r: dict[str, Any]) -> None:
    print(f"test prompts: {r['splits']['test']}")
    for name, acc in r["models"].items():
        print(f"  {name:<14} {100 * acc:6.2f}%")
    print(f"  large right where small wrong: {100 * r['large_right_small_wrong_test']:.1f}%, "
          f"the reverse: {100 * r['small_right_large_wrong_test']:.1f}%")
    for name, q in r["targets"].items():
        print(f"  router [{name}]: {100 * q['accuracy']:.2f}% with {100 * q['large_share']:.1f}%"
              f" large calls ({q['gap_to_large_pt']:+.2f} pt vs large); random at that share "
              f"{100 * q['random_same_share']:.2f}%")


def _plot(router: Any, features: np.ndarray, small_right: np.ndarray,
          large_right: np.ndarray, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = router.scores(features)
    order = np.argsort(-scores)
    shares, accs = [0.0], [float(small_right.mean())]
    for k in range(1, len(order) + 1):
        to_large = np.zeros(len(order), dtype=bool)
        to_large[order[:k]] = True
        shares.append(k / len(order))
        accs.append(float(np.where(to_large, large_right, small_right).mean()))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.asarray(shares) * 100, np.asarray(accs) * 100, label="difficulty router")
    ax.plot([0, 100], [100 * small_right.mean(), 100 * large_right.mean()], "--",
            label="random routing")
    ax.axhline(100 * large_right.mean() - 1, color="grey", lw=0.8, label="large - 1 pt")
    ax.set_xlabel("share of prompts sent to the large model (%)")
    ax.set_ylabel("accuracy on held-out prompts (%)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
