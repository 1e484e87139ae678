"""What pricing split plans costs a device: ``TierlinkPolicy.plan`` for an ``imagenet``
request on a device holding MobileNetV2's head (this machine's split profile: 19 block cuts x
the codecs measured at each) with the model in the cloud, one link between them.

Two cases, interleaved round by round, every decision timed on its own after a warm-up:

* ``fresh_view``: a new snapshot for every decision (the worst case: a node's view refreshes
  every 0.25 s, so under light load most requests meet a new one);
* ``same_view``: decisions over one snapshot (the policy's per-view memo holds).

A 0.1-core device pays ten times these figures. Prints a table, writes JSON::

    .venv/bin/python benchmarks/split_planning.py [--json PATH] [--decisions 2000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any


def views() -> tuple[Any, Any]:
    """(a function making a fresh snapshot, the request) over this machine's profile."""
    from tierlink.core.types import (
        ClusterView,
        LinkView,
        ModelView,
        NodeView,
        Privacy,
        Request,
        SplitPoint,
        Tier,
    )
    from tierlink.models.split_profile import load_profile, profile_path
    from tierlink.zoo.mobilenet import card_path, ensure_mobilenet
    from tierlink.zoo.photo_models import PHOTO_TASK, ensure_split_profile

    onnx = ensure_mobilenet()
    ensure_split_profile("imagenet-mobilenetv2", onnx)
    profile = load_profile(profile_path(card_path(onnx)))
    assert profile is not None
    points = profile.points
    heads = tuple(SplitPoint(p.cut, p.head_ms * 10, 0.0, p.feature_bytes, p.codecs)
                  for p in points)  # a device ten times slower than the profiling core

    def model(ms: float, splits: tuple[SplitPoint, ...]) -> ModelView:
        return ModelView("imagenet-mobilenetv2", PHOTO_TASK, "1", 0.72, ms, splits=splits)

    device = NodeView("dev-1", Tier.DEVICE, (model(140.0, points),),
                      heads=(model(140.0, heads),))
    cloud = NodeView("cloud-1", Tier.CLOUD, (model(14.0, points),))

    def fresh() -> ClusterView:
        return ClusterView.build("dev-1", [device, cloud],
                                 [LinkView("dev-1", "cloud-1", 10.0, 20.0)])

    request = Request("r", PHOTO_TASK, 1000.0, origin="dev-1", privacy=Privacy.ANY,
                      input_bytes=602_112)
    return fresh, request


def run(decisions: int) -> dict[str, Any]:
    from tierlink.policy.base import PolicyConfig, Weights
    from tierlink.policy.placement import TierlinkPolicy

    fresh, request = views()
    config = PolicyConfig(weights=Weights(accuracy=1.0, latency=5.0, cost=0.0))
    # one policy per case: the per-view memo would otherwise be dropped by the other case
    policies = {"fresh_view": TierlinkPolicy(config), "same_view": TierlinkPolicy(config)}
    rng, same = random.Random(0), fresh()
    for _ in range(200):
        for policy in policies.values():
            policy.plan(request, fresh(), rng)
    took: dict[str, list[float]] = {case: [] for case in policies}
    for _ in range(decisions):
        for case, times in took.items():
            view = fresh() if case == "fresh_view" else same
            start = time.perf_counter_ns()
            policies[case].plan(request, view, rng)
            times.append((time.perf_counter_ns() - start) / 1000.0)
    return {case: {"p50_us": statistics.median(v),
                   "p99_us": statistics.quantiles(v, n=100)[98], "decisions": len(v)}
            for case, v in took.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args(argv)
    result = run(args.decisions)
    print(f"{'case':12s} {'p50 us':>8s} {'p99 us':>8s}")
    for case, r in result.items():
        print(f"{case:12s} {r['p50_us']:8.1f} {r['p99_us']:8.1f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
