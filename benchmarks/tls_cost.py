"""What TLS costs per hop: two identical fleets side by side — one plain HTTP, one with
TLS on every hop (`security: {tls: true}`: mutual TLS between nodes, claims bound to the
sender) — driven in alternating rounds by the same sequential requests.

Cases, each per fleet:

    client_hop   an application -> edge-1's model (one hop, a kept-alive connection)
    node_hop     an application -> dev-2 (no model) -> edge-1's model: the node-to-node
                 hop the fleet adds (dev-2 relays; its connection to edge-1 is kept alive)
    handshake    a new connection per request (GET /v2/health/live): what a TLS handshake
                 costs when nothing is kept alive

Reports p50 / p95 latency (ms) and the CPU the nodes spent per request (from /proc), TLS
over plain per case, and the node-to-node hop's own cost: node_hop minus client_hop.

    python benchmarks/tls_cost.py --json docs/results/tls-cost.json
    python benchmarks/routing_overhead.py --part tls     (the same, from the routing-overhead
                                                          benchmark)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from tracing_cost import cpu_s  # benchmarks/ is on the path: this file runs as a script

from tierlink.fleet.config import parse_fleet, with_tls
from tierlink.transport.oip import encode_infer_request

FLEET = {
    "name": "tls-cost", "seed": 5, "zoo": {"profile": "test"}, "control": {"ttl_s": 5},
    "routing": {"policy": "tierlink"},
    "nodes": [{"id": "edge-1", "tier": "edge", "models": ["fmnist-small"]},
              {"id": "dev-2", "tier": "device", "models": []}],
    "links": [],
}
CASES = ("client_hop", "node_hop", "handshake")
NODES = ("dev-2", "edge-1")
def calls(fleet: Any, http: httpx.Client, body: tuple[bytes, dict[str, str]]
          ) -> dict[str, Callable[[], int]]:
    edge, dev = fleet.node_urls["edge-1"], fleet.node_urls["dev-2"]
    content, headers = body
    # One context for every new connection (loading a trust store per client would cost
    # more than the handshake); the plain fleet needs none.
    verify = fleet.verify() if fleet.pki else False

    def client_hop() -> int:
        return http.post(f"{edge}/v2/models/fmnist-small/infer", content=content,
                         headers=headers).status_code

    def node_hop() -> int:
        return http.post(f"{dev}/v2/models/fmnist/infer", content=content,
                         headers=headers).status_code

    def handshake() -> int:
        with httpx.Client(verify=verify, trust_env=False, timeout=10.0) as fresh:
            return fresh.get(f"{edge}/v2/health/live").status_code

    return {"client_hop": client_hop, "node_hop": node_hop, "handshake": handshake}


def one_block(call: Callable[[], int], n: int, pids: list[int]) -> tuple[list[float], float]:
    before = cpu_s(pids)
    latencies = []
    for _ in range(n):
        t0 = time.perf_counter()
        status = call()
        latencies.append((time.perf_counter() - t0) * 1000.0)
        assert status == 200, status
    return latencies, (cpu_s(pids) - before) * 1000.0 / n


def measure(requests: int, rounds: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    from tierlink.fleet.launcher import launch
    from tierlink.models.catalog import Catalog, SourceOptions
    from tierlink.zoo.datasets import fashion_mnist

    base = parse_fleet(FLEET)
    catalog = Catalog.default(SourceOptions(profile=base.zoo_profile, progress=False))
    models = catalog.paths(base.model_names())
    image = fashion_mnist().test.input[:1]
    body = encode_infer_request({"input": image}, {"tierlink.privacy": "any",
                                                   "tierlink.deadline_ms": 2000.0}, None)
    root = Path(tempfile.mkdtemp(prefix="tierlink-tls-cost-"))
    fleets = {"plain": launch(base, models, root / "plain"),
              "tls": launch(replace(with_tls(base, True), name="tls-cost-tls"), models,
                            root / "tls")}
    results = {f: {c: {"ms": [], "cpu_ms": []} for c in CASES} for f in fleets}
    try:
        clients = {f: httpx.Client(verify=fl.verify(), trust_env=False, timeout=10.0)
                   for f, fl in fleets.items()}
        drivers = {f: calls(fl, clients[f], body) for f, fl in fleets.items()}
        pids = {f: [fl.procs[n].pid for n in NODES] for f, fl in fleets.items()}
        for f in fleets:  # warm-up, not counted
            for case in CASES:
                one_block(drivers[f][case], 30, pids[f])
        for r in range(rounds):
            for f in (list(fleets) if r % 2 == 0 else list(reversed(fleets))):
                for case in CASES:
                    ms, cpu = one_block(drivers[f][case], requests, pids[f])
                    results[f][case]["ms"] += ms
                    results[f][case]["cpu_ms"].append(cpu)
            say(f"round {r + 1}/{rounds} done")
        for client in clients.values():
            client.close()
    finally:
        for fleet in fleets.values():
            fleet.stop()
    return report(results, requests, rounds)


def report(results: dict[str, Any], requests: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {"requests_per_round": requests, "rounds": rounds}
    for f, cases in results.items():
        out[f] = {}
        for case, r in cases.items():
            ms = sorted(r["ms"])
            out[f][case] = {"p50_ms": round(statistics.median(ms), 3),
                            "p95_ms": round(ms[int(0.95 * len(ms))], 3),
                            "cpu_ms_per_request": round(statistics.median(r["cpu_ms"]), 3)}
    out["ratio_tls_plain"] = {case: {k: _ratio(out["tls"][case][k], out["plain"][case][k])
                                     for k in ("p50_ms", "p95_ms", "cpu_ms_per_request")}
                              for case in CASES}
    out["node_to_node_hop"] = {f: {k: round(out[f]["node_hop"][k] - out[f]["client_hop"][k], 3)
                                   for k in ("p50_ms", "cpu_ms_per_request")}
                               for f in results}
    return out


def _ratio(tls: float, plain: float) -> float | None:
    """None where the plain figure is 0 (CPU is read in 10 ms ticks: a short run may see
    none)."""
    return round(tls / plain, 3) if plain else None


def print_table(out: dict[str, Any]) -> None:
    print(f"{'case':<12} {'fleet':<6} {'p50 ms':>8} {'p95 ms':>8} {'CPU ms/req':>11}")
    for case in CASES:
        for f in ("plain", "tls"):
            r = out[f][case]
            print(f"{case:<12} {f:<6} {r['p50_ms']:>8} {r['p95_ms']:>8} "
                  f"{r['cpu_ms_per_request']:>11}")
        ratio = out["ratio_tls_plain"][case]
        print(f"{'':<12} {'tls/plain':<6} {ratio['p50_ms']!s:>6}x {ratio['p95_ms']!s:>7}x "
              f"{ratio['cpu_ms_per_request']!s:>10}x")
    hop = out["node_to_node_hop"]
    print(f"node-to-node hop (node_hop - client_hop): plain {hop['plain']['p50_ms']} ms, "
          f"tls {hop['tls']['p50_ms']} ms p50; CPU {hop['plain']['cpu_ms_per_request']} vs "
          f"{hop['tls']['cpu_ms_per_request']} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=200, help="per case, round and fleet")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    out = measure(args.requests, args.rounds)
    print_table(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
