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
from pathlib import Path
from typing import Any

import numpy as np


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--png", type=Path)
    p.add_argument("--n", type=int, default=1200)
    p.add_argument("--small", default="int8", choices=("int8", "q3"))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from tierlink.cascade.tune import Target, TargetKind
    from tierlink.chat.router_train import SPLITS, answers, train_router

    args = parse_args(argv)
    small = answers(args.small, args.n, args.seed, progress=print)
    large = answers("fp32", args.n, args.seed, progress=print)
    test = slice(int((SPLITS[0] + SPLITS[1]) * args.n), args.n)
    s_right, l_right = small.right, large.right
    result: dict[str, Any] = {
        "n": args.n,
        "models": {f"small ({args.small})": float(s_right[test].mean()),
                   "large (fp32)": float(l_right[test].mean())},
        "small_right_large_wrong_test": float((s_right & ~l_right)[test].mean()),
        "large_right_small_wrong_test": float((l_right & ~s_right)[test].mean()),
        "targets": {}}
    targets = {"within_1pt": lambda top: Target(TargetKind.ACCURACY_FLOOR, top - 0.01),
               "half_the_calls": lambda _top: Target(TargetKind.ESCALATION_BUDGET, 0.5)}
    router = None
    for name, target_for in targets.items():
        report = train_router(small, large, target_for, args.seed)
        result["targets"][name] = report.figures
        router = router or report.router
    _print(result)
    if args.png and router is not None:
        _plot(router, small.features[test], s_right[test], l_right[test], args.png)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


def _print(r: dict[str, Any]) -> None:
    print(f"test prompts: {r['n'] - int(0.75 * r['n'])}")
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
