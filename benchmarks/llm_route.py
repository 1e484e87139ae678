"""Routing chat by difficulty: each model's quality, the routers', and their large-model calls.

Labelled prompts built offline: Rotten Tomatoes snippets asked as "positive or negative?",
each model's answer read from the likelihood of the label words (``llm/labelled.py``). The
small model is the device's (SmolLM2 INT8, as the fleet serves it; ``--small``), the large one
the cloud's (SmolLM2 FP32). The prompts split into train (the routers), calibration (the
deployed router's threshold: ``tierlink cascade tune``'s tuner, for "within 1 point of the
large model" and for "at most half the calls") and test (everything reported).

``routers``: every router judged as RouteLLM judges them (``chat/router_eval.py``): the
quality at each share of large-model calls, APGR and CPT(50/80/95%) — the deployed one (a
logistic regression on the small model's prompt state, ``state_lr``), a kNN over the same
state, a logistic regression and a kNN over the prompt's MiniLM sentence embedding, the
small model's own confidence, and the references ``random`` and ``oracle``. Scores are
cached under ``$TIERLINK_HOME/llm/scores``.

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
    curves, scores = judged(small, large, args.n, args.seed)
    result["routers"] = {name: c.figures() for name, c in curves.items()}
    result["above_random_95"] = above_random(scores, s_right[test], l_right[test], args.seed)
    result.update(verdict(result["routers"]))
    result["curves"] = {name: [round(float(q), 4) for q in c.quality]
                        for name, c in curves.items()}
    _print(result)
    if args.png:
        _plot(curves, args.png)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


LEARNED = ("state_lr", "state_knn", "embedding_lr", "embedding_knn", "small_confidence")


def judged(small: Any, large: Any, n: int, seed: int
           ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Every router's curve on the test prompts, trained on the train prompts; the scores
    of those that score prompts."""
    from tierlink.chat.router import fit, needs_large
    from tierlink.chat.router_eval import curve, knn_scores, oracle_scores, random_curve
    from tierlink.chat.router_train import SPLITS
    from tierlink.llm.embed import SentenceEncoder
    from tierlink.llm.labelled import rotten_tomatoes

    a, b = int(SPLITS[0] * n), int((SPLITS[0] + SPLITS[1]) * n)
    train, test = slice(0, a), slice(b, n)
    s_right, l_right = small.right, large.right
    target = needs_large(s_right[train], l_right[train])
    texts = [item.text for item in rotten_tomatoes(seed)[:n]]
    print(f"embedding {n} prompts (MiniLM)")
    embedded = SentenceEncoder().encode(texts)
    scores = {
        "state_lr": fit(small.features[train], target).scores(small.features[test]),
        "state_knn": knn_scores(small.features[train], target, small.features[test]),
        "embedding_lr": fit(embedded[train], target).scores(embedded[test]),
        "embedding_knn": knn_scores(embedded[train], target, embedded[test]),
        "small_confidence": 1.0 - small.probs[test].max(axis=1),
        "oracle": oracle_scores(s_right[test], l_right[test]),
    }
    curves = {name: curve(v, s_right[test], l_right[test]) for name, v in scores.items()}
    curves["random"] = random_curve(s_right[test], l_right[test])
    return curves, scores


def above_random(scores: dict[str, np.ndarray], small_right: np.ndarray,
                 large_right: np.ndarray, seed: int) -> dict[str, list[float]]:
    """Each learned router's APGR above random's: a 95% bootstrap interval over the test
    prompts (the router stays as trained)."""
    from tierlink.chat.router_eval import apgr_interval

    rng = np.random.default_rng(seed)
    return {name: [round(x, 4) for x in apgr_interval(scores[name], small_right, large_right,
                                                        rng)]
            for name in LEARNED}


def verdict(routers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best learned router against ``random`` and ``oracle`` (APGR points)."""
    best = max(LEARNED, key=lambda name: routers[name]["apgr"])
    apgr = routers[best]["apgr"]
    return {"best_learned": best,
            "best_above_random": round(apgr - routers["random"]["apgr"], 4),
            "best_short_of_oracle": round(routers["oracle"]["apgr"] - apgr, 4)}


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
    print(f"  {'router':<18} {'APGR':>6} {'CPT50':>6} {'CPT80':>6} {'CPT95':>6}")
    for name, f in sorted(r["routers"].items(), key=lambda kv: -kv[1]["apgr"]):
        cpts = " ".join("     -" if f[k] is None else f"{100 * f[k]:5.1f}%"
                        for k in ("cpt50", "cpt80", "cpt95"))
        print(f"  {name:<18} {f['apgr']:6.3f} {cpts}")
    print(f"  best learned: {r['best_learned']}, APGR {r['best_above_random']:+.3f} above "
          f"random, {r['best_short_of_oracle']:.3f} short of the oracle")
    for name, (lo, hi) in r["above_random_95"].items():
        print(f"  {name:<18} APGR above random, 95% bootstrap: [{lo:+.3f}, {hi:+.3f}]")


def _plot(curves: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for name, c in sorted(curves.items(), key=lambda kv: -kv[1].apgr):
        style = {"random": "--", "oracle": ":"}.get(name, "-")
        top.plot(100 * c.shares, 100 * c.quality, style, label=f"{name} (APGR {c.apgr:.2f})")
        bottom.plot(100 * c.shares, 100 * c.pgr, style)
    top.set_ylabel("accuracy on held-out prompts (%)")
    top.legend(fontsize=8)
    bottom.set_ylabel("performance gap recovered (%)")
    bottom.set_xlabel("share of prompts sent to the large model (%)")
    for level in (50, 80, 95):
        bottom.axhline(level, color="grey", lw=0.6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
