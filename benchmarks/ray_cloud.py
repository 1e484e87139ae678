"""A cloud tier on Ray Serve against a cloud node with fixed workers, side by side under a
load ramp.

One fleet, two cloud nodes serving the same MobileNetV2 (batches of ``--batch`` 224x224
photos, ~13 ms per photo on one core): ``cloud-fixed`` runs it in its own process on ONNX Runtime with
``--fixed-workers`` workers (1: the node's default), ``cloud-ray`` on Ray Serve
(``engine: ray``: 1..2 replicas of 1 CPU each, scaled on the requests in flight). At each step
of the ramp both get the same open-loop Poisson load (``rps``), one after the other (the
order alternates step by step), each for ``--step-s`` seconds; every request carries a
deadline (``--deadline-ms``). Per step and engine: p50 / p95 latency and SLA attainment
(the share answered within the deadline; refusals and errors count as misses), and the Ray
replicas running at the end of the step.

    python benchmarks/ray_cloud.py --json docs/results/ray-cloud.json
        [--steps 2,4,6,8,10,12,14] [--step-s 20] [--deadline-ms 1000] [--fixed-workers 1]
        [--batch 8]

JSON: ``{"steps": [{"rps", "engine", "p95_ms", "sla_attainment", ...}], ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

MODEL = "imagenet-mobilenetv2"
ENGINES = {"fixed": "cloud-fixed", "ray": "cloud-ray"}


def fleet_yaml(fixed_workers: int) -> dict[str, Any]:
    return {
        "name": "ray-cloud", "seed": 3, "zoo": {"profile": "test"}, "control": {"ttl_s": 5},
        "routing": {"policy": "tierlink"},
        "nodes": [
            {"id": "cloud-fixed", "tier": "cloud", "models": [MODEL],
             "workers": fixed_workers},
            {"id": "cloud-ray", "tier": "cloud", "models": [MODEL], "workers": 8,
             "engine": "ray", "ray": {"min_replicas": 1, "max_replicas": 2, "num_cpus": 1.0,
                                      "target_ongoing_requests": 1, "upscale_delay_s": 1.0,
                                      "downscale_delay_s": 60.0}}],
        "links": [],
    }


async def step(url: str, rps: float, seconds: float, deadline_ms: float,
               body: tuple[bytes, dict[str, str]], rng: random.Random) -> dict[str, Any]:
    """An open-loop Poisson load on ``url``'s model for ``seconds``; per-request results."""
    content, headers = body
    results: list[tuple[float, bool]] = []  # (latency ms, answered within the deadline)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(trust_env=False, timeout=deadline_ms / 1000 + 5,
                                 limits=limits) as http:
        async def one(at: float, start: float) -> None:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            t0 = time.monotonic()
            try:
                r = await http.post(f"{url}/v2/models/{MODEL}/infer", content=content,
                                    headers=headers)
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            ms = (time.monotonic() - t0) * 1000.0
            results.append((ms, ok and ms <= deadline_ms))

        times, t = [], 0.0
        while True:
            t += rng.expovariate(rps)
            if t >= seconds:
                break
            times.append(t)
        start = time.monotonic() + 0.2
        await asyncio.gather(*(one(at, start) for at in times))
    ms = sorted(r[0] for r in results)
    return {"requests": len(results),
            "p50_ms": round(statistics.median(ms), 1) if ms else None,
            "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 1) if ms else None,
            "sla_attainment": round(sum(r[1] for r in results) / max(1, len(results)), 4)}


def ray_replicas(http: httpx.Client, url: str) -> int | None:
    status = http.get(f"{url}/tierlink/v1/status").json()
    return status.get("engine", {}).get("replicas", {}).get(MODEL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--steps", default="2,4,6,8,10,12,14", help="requests/s per step")
    p.add_argument("--step-s", type=float, default=20.0)
    p.add_argument("--deadline-ms", type=float, default=1000.0)
    p.add_argument("--fixed-workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=8,
                   help="photos per request (a cloud tier's batch; Ray's per-call overhead "
                        "of a few ms is then small beside the compute)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    from tierlink.fleet.config import parse_fleet
    from tierlink.fleet.launcher import launch
    from tierlink.transport.oip import encode_infer_request
    from tierlink.zoo.photo_models import photo_models

    models = photo_models([MODEL])
    x = np.random.default_rng(0).random((args.batch, 3, 224, 224), dtype=np.float32)
    body = encode_infer_request({"input": x}, {"tierlink.deadline_ms": args.deadline_ms}, None,
                                binary_inputs=True, binary_outputs=True)
    rates = [float(r) for r in args.steps.split(",")]
    rng = random.Random(7)
    rows: list[dict[str, Any]] = []
    fleet = launch(parse_fleet(fleet_yaml(args.fixed_workers)), models,
                   Path(tempfile.mkdtemp(prefix="tierlink-ray-cloud-")))
    try:
        with httpx.Client(trust_env=False, timeout=10.0) as http:
            for engine, node in ENGINES.items():  # warm-up: sessions, pools, a first replica
                asyncio.run(step(fleet.node_urls[node], 2.0, 3.0, args.deadline_ms, body, rng))
            for i, rps in enumerate(rates):
                order = list(ENGINES) if i % 2 == 0 else list(reversed(ENGINES))
                for engine in order:
                    url = fleet.node_urls[ENGINES[engine]]
                    row = {"rps": rps, "engine": engine,
                           **asyncio.run(step(url, rps, args.step_s, args.deadline_ms, body,
                                              rng))}
                    if engine == "ray":
                        row["replicas"] = ray_replicas(http, url)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        fleet.stop()
    out = {"steps": rows, "model": MODEL, "batch": args.batch, "deadline_ms": args.deadline_ms,
           "step_s": args.step_s, "fixed_workers": args.fixed_workers}
    print(f"{'rps':>5} {'engine':<6} {'p50 ms':>8} {'p95 ms':>8} {'SLA':>7} {'replicas':>8}")
    for r in rows:
        print(f"{r['rps']:>5g} {r['engine']:<6} {r['p50_ms']!s:>8} {r['p95_ms']!s:>8} "
              f"{100 * r['sla_attainment']:>6.1f}% {r.get('replicas', '')!s:>8}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
