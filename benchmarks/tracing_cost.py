"""What tracing costs a request: two identical fleets (a device and an edge; the device's
answers escalate to the edge about half the time) side by side, one sending every span to
an OTLP receiver, one with tracing off, driven in alternating rounds by the same sequential
requests. Reports per fleet the latency (p50 / p95, ms) and the CPU the nodes spent per
request (from /proc), and their ratios.

    python benchmarks/tracing_cost.py --json docs/results/tracing-cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tierlink.fleet.config import parse_fleet, with_tracing
from tierlink.transport.oip import encode_infer_request

FLEET = {
    "name": "tracing-cost", "seed": 5, "zoo": {"profile": "test"}, "control": {"ttl_s": 5},
    "routing": {"policy": "tierlink", "thresholds": {"fmnist-small": 0.9}},
    "nodes": [{"id": "edge-1", "tier": "edge", "models": ["fmnist-medium"]},
              {"id": "dev-1", "tier": "device", "models": ["fmnist-small"]}],
    "links": [{"from": "dev-1", "to": "edge-1", "delay_ms": 1}],
}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICKS


def one_round(http: httpx.Client, url: str, bodies: list[tuple[bytes, dict[str, str]]],
              pids: list[int]) -> tuple[list[float], float]:
    before = cpu_s(pids)
    latencies = []
    for body, headers in bodies:
        t0 = time.perf_counter()
        r = http.post(f"{url}/v2/models/fmnist/infer", content=body, headers=headers)
        latencies.append((time.perf_counter() - t0) * 1000.0)
        assert r.status_code == 200, r.text
    return latencies, cpu_s(pids) - before


def sampled(config: Any, ratio: float) -> Any:
    from tierlink.settings.tracing import parse_tracing

    return replace(config, tracing=parse_tracing({"sample_ratio": ratio}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=300, help="per round and fleet")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--sample-ratio", type=float, default=1.0,
                   help="the traced fleet's tracing.sample_ratio")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    from tierlink.fleet.launcher import launch
    from tierlink.models.catalog import Catalog, SourceOptions
    from tierlink.zoo.datasets import fashion_mnist

    base = parse_fleet(FLEET)
    catalog = Catalog.default(SourceOptions(profile=base.zoo_profile, progress=False))
    models = catalog.paths(base.model_names())
    images = fashion_mnist().test.input
    rng = np.random.default_rng(3)
    bodies = [encode_infer_request({"input": images[i: i + 1]}, {
        "tierlink.privacy": "any", "tierlink.deadline_ms": 2000.0}, None)
        for i in rng.integers(0, len(images), args.requests)]
    root = Path(tempfile.mkdtemp(prefix="tierlink-tracing-cost-"))
    fleets = {"off": launch(base, models, root / "off"),
              "on": launch(replace(with_tracing(sampled(base, args.sample_ratio), True, None),
                                   name="traced"), models, root / "on")}
    results: dict[str, dict[str, list[float]]] = {k: {"ms": [], "cpu_ms": []} for k in fleets}
    try:
        with httpx.Client(trust_env=False, timeout=10.0) as http:
            for name, fleet in fleets.items():  # warm-up, not counted
                one_round(http, fleet.node_urls["dev-1"], bodies[:50],
                          [fleet.procs[n].pid for n in ("dev-1", "edge-1")])
            for r in range(args.rounds):
                order = list(fleets) if r % 2 == 0 else list(reversed(fleets))
                for name in order:
                    fleet = fleets[name]
                    lat, cpu = one_round(http, fleet.node_urls["dev-1"], bodies,
                                         [fleet.procs[n].pid for n in ("dev-1", "edge-1")])
                    results[name]["ms"] += lat
                    results[name]["cpu_ms"].append(cpu * 1000.0 / len(bodies))
        traces = fleets["on"].traces_file
        time.sleep(1.0)  # the last batch of spans
        spans = len(traces.read_text().splitlines()) if traces and traces.exists() else 0
    finally:
        for fleet in fleets.values():
            fleet.stop()
    report: dict[str, Any] = {"requests_per_round": args.requests, "rounds": args.rounds,
                              "sample_ratio": args.sample_ratio, "exports_received": spans}
    for name, r in results.items():
        ms = sorted(r["ms"])
        report[name] = {"p50_ms": round(statistics.median(ms), 3),
                        "p95_ms": round(ms[int(0.95 * len(ms))], 3),
                        "cpu_ms_per_request": round(statistics.median(r["cpu_ms"]), 3)}
    report["ratio_on_off"] = {k: round(report["on"][k] / report["off"][k], 3)
                              for k in ("p50_ms", "p95_ms", "cpu_ms_per_request")}
    print(f"{'tracing':<8} {'p50 ms':>8} {'p95 ms':>8} {'CPU ms/request':>15}")
    for name in ("off", "on"):
        print(f"{name:<8} {report[name]['p50_ms']:>8} {report[name]['p95_ms']:>8} "
              f"{report[name]['cpu_ms_per_request']:>15}")
    print(json.dumps(report["ratio_on_off"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
