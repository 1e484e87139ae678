"""The control plane under a large fleet, and through failures: etcd replicas and SQLite.

Four parts, each on real processes (pick with ``--parts``):

* ``cost`` -- control-plane CPU per heartbeat (``/proc``), 3,000 heartbeats 32 at a time to
  one replica of each store: ones that repeat the node's last heartbeat, then changed ones.
* ``heartbeats`` -- ``--nodes`` simulated nodes (10,000) heartbeat every ``--interval`` s
  (5: 2,000 heartbeats/s) for ``--step-s`` seconds, open loop (each node on its own
  schedule; a late answer does not slow the sender), against two control-plane replicas
  over a three-member etcd cluster (split between them), then against one SQLite control
  plane. A share ``--changed`` of heartbeats carries a new load figure; the rest repeat
  the previous one (a quiet node). Per store: p50/p99 heartbeat latency, achieved rate,
  CPU (cores) and RSS per replica (and etcd's CPU), and view propagation (a probe node's
  change posted to one replica until a node watching another holds the new view). Then
  the rate steps up (``--rates``) to the highest the store sustains on this machine
  (achieved >= 95% of the offered rate, p99 <= 100 ms, no error). The load generator
  shares this machine's cores, so it is kept lean (``lean_http.py``: keep-alive sockets
  and prepared bodies, a fraction of aiohttp's CPU per request); its CPU is reported too.
* ``failover`` -- a fleet (``tierlink up`` with ``control: {store: etcd, replicas: 2}``,
  the zoo's test profile) under steady inference load from its devices and a stream of
  registry writes (node enrollments, through whichever replica answers); one replica is
  killed (kill -9), then one etcd member. Counts requests that failed and acknowledged
  writes that cannot be read back afterwards (``failover: {"failed", "lost_writes"}``).
* ``join`` -- on that fleet, still under load, a new edge starts in the devices' site:
  seconds from its start to the first request it serves, and its share of edge-served
  requests over the next 10 s (``join: {"seconds_to_serve", "share"}``).

    .venv/bin/python benchmarks/registry_scale.py [--nodes 10000] [--interval 5]
        [--step-s 20] [--rates 500,1000,2000,3000,4000]
        [--parts cost,heartbeats,failover,join]
        [--json PATH]

Prints a table and writes JSON; every process it started is stopped, also on error.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import aiohttp
import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_support import cpu_s
from lean_http import LeanPoster

P99_TARGET_MS = 100.0
# Long enough that the first nodes' leases outlive the registration of all 10,000 (about
# 160 registrations/s on etcd here: a lease grant and a transaction each, fsynced by a
# quorum of three members on one disk); renewals then come every TTL/3.
TTL_S = 90.0


# -- processes ------------------------------------------------------------------------------


@dataclass
class Control:
    """The control-plane processes of one store, and what else to watch (etcd)."""

    name: str
    urls: list[str]
    pids: list[int]
    etcd_pids: list[int]


def _spawn_control(stack: ExitStack, run: Path, name: str, etcd: list[str]) -> tuple[str, int]:
    ready = run / f"{name}.ready"
    args = [sys.executable, "-m", "tierlink.control.server", "--port", "0", "--open",
            "--db", str(run / f"{name}.db"), "--ttl", str(TTL_S), "--ready-file", str(ready)]
    if etcd:
        args += ["--etcd", ",".join(etcd), "--repo-dir", str(run / "blobs")]
    log = (run / f"{name}.log").open("ab")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    stack.callback(_stop, proc)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"control plane {name} did not start; see {run}/{name}.log")
        time.sleep(0.05)
    return f"http://127.0.0.1:{json.loads(ready.read_text())['port']}", proc.pid


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start_store(stack: ExitStack, store: str, replicas: int = 2) -> Control:
    run = Path(tempfile.mkdtemp(prefix=f"tierlink-registry-scale-{store}-"))
    if store == "sqlite":
        url, pid = _spawn_control(stack, run, "control", [])
        return Control(store, [url], [pid], [])
    from tierlink.etcd.cluster import EtcdCluster

    cluster = EtcdCluster(run / "etcd", size=3).start()
    stack.callback(cluster.stop)
    started = [_spawn_control(stack, run, f"control-{i}", cluster.endpoints)
               for i in range(replicas)]
    pids = [m.process.pid for m in cluster.members if m.process is not None]
    return Control(store, [u for u, _ in started], [p for _, p in started], pids)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- heartbeats -----------------------------------------------------------------------------


def body(i: int, load: int, started_at: float) -> dict[str, Any]:
    """A device-like node: one model, one link; ``load`` is the figure that changes."""
    return {"node_id": f"sim-{i:05d}", "tier": "device",
            "address": f"http://10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000",
            "models": [{"name": "fmnist-small-fp16", "task": "fmnist", "version": "1",
                        "accuracy": 0.927, "latency_ms": 0.4, "output_bytes": 64}],
            "queue_depth": load, "inflight": 0, "workers": 1, "upstream": ["edge-1"],
            "links": [{"dst": "edge-1", "rtt_ms": 10.0, "bandwidth_mbit": 100.0}],
            "started_at": started_at, "labels": {"site": f"s{i % 200}"}}


async def register(posters: list[LeanPoster], nodes: int, started_at: float) -> None:
    """Every simulated node's first heartbeat (not measured), 64 at a time."""
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with sem:
            status = await posters[i % len(posters)].post(
                f"/v1/nodes/sim-{i:05d}/heartbeat", encoded(i, 0, started_at))
            if status != 200:
                raise RuntimeError(f"registering sim-{i:05d} answered {status}")

    await asyncio.gather(*(one(i) for i in range(nodes)))


@functools.cache
def encoded(i: int, load: int, started_at: float) -> bytes:
    """:func:`body` as JSON bytes, made once (the generator must stay cheap)."""
    return json.dumps(body(i, load, started_at), separators=(",", ":")).encode()


async def steady(posters: list[LeanPoster], nodes: int, rate: float,
                 seconds: float, changed: float, started_at: float,
                 rng: random.Random) -> dict[str, Any]:
    """Open-loop heartbeats at ``rate`` per second for ``seconds``: latencies, errors."""
    count = int(rate * seconds)
    latencies: list[float] = []
    errors = 0
    loads = [0] * nodes
    t0 = time.perf_counter()

    async def one(k: int) -> None:
        nonlocal errors
        i = k % nodes
        if rng.random() < changed:
            loads[i] = (loads[i] + 1) % 8
        sent = time.perf_counter()
        try:
            status = await posters[i % len(posters)].post(
                f"/v1/nodes/sim-{i:05d}/heartbeat", encoded(i, loads[i], started_at))
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            errors += 1
            return
        if status != 200:
            errors += 1
            return
        latencies.append((time.perf_counter() - sent) * 1000)

    tasks = []
    # The generator's own garbage collector, walking tens of thousands of live tasks, held
    # it up to ~150 ms at a time (each such pause counted as the servers' latency): it is
    # off while the load runs and collects after, as timeit does.
    gc.disable()
    try:
        for k in range(count):
            due = t0 + k / rate
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(k)))
        await asyncio.gather(*tasks)
    finally:
        gc.enable()
    wall = time.perf_counter() - t0
    gc.collect()
    lat = np.array(latencies) if latencies else np.array([float("nan")])
    return {"offered_per_s": rate, "achieved_per_s": round(len(latencies) / wall, 1),
            "errors": errors, "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2), "wall_s": round(wall, 2)}


async def propagation(urls: list[str], rounds: int = 10) -> dict[str, float]:
    """How long a change takes to reach a node: a watcher on the last replica (``GET
    /v1/nodes?since=R&wait=S``, what a node runs) waits while a probe's changed heartbeat
    is posted to the first; the time until the watcher holds a view with the change (the
    whole view of every node: that is what a node receives)."""
    times = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for k in range(rounds):
            value = k % 7 + 1
            async with http.get(f"{urls[-1]}/v1/nodes", params={"splits": "digest"}) as r:
                revision = (await r.json())["revision"]
            watcher = asyncio.create_task(_watch_for(http, urls[-1], revision, value))
            await asyncio.sleep(0.05)
            probe = body(99_999, value, 1.0) | {"node_id": "probe"}
            t = time.perf_counter()
            async with http.post(f"{urls[0]}/v1/nodes/probe/heartbeat", json=probe) as r:
                r.raise_for_status()
            await watcher
            times.append((time.perf_counter() - t) * 1000)
    return {"p50_ms": round(statistics.median(times), 2),
            "p95_ms": round(float(np.percentile(times, 95)), 2), "rounds": rounds}


async def _watch_for(http: aiohttp.ClientSession, url: str, revision: str, value: int) -> None:
    """Watch until the probe shows ``value`` (other changes just move the revision on)."""
    while True:
        params = {"splits": "digest", "since": revision, "wait": "20"}
        async with http.get(f"{url}/v1/nodes", params=params) as r:
            answer = await r.json()
        revision = answer["revision"]
        probe = next((n for n in answer.get("nodes", ()) if n["node_id"] == "probe"), None)
        if probe is not None and probe["queue_depth"] == value:
            return


async def heartbeat_run(control: Control, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(7)
    started_at = time.time()
    rate = args.nodes / args.interval
    posters = [LeanPoster(url, connections=256 // len(control.urls)) for url in control.urls]
    try:
        t = time.perf_counter()
        await register(posters, args.nodes, started_at)
        registered_per_s = args.nodes / (time.perf_counter() - t)
        before = {pid: cpu_s(pid) for pid in (*control.pids, *control.etcd_pids, os.getpid())}
        t = time.perf_counter()
        result = await steady(posters, args.nodes, rate, args.step_s, args.changed,
                              started_at, rng)
        wall = time.perf_counter() - t
        cores = {pid: (cpu_s(pid) - before[pid]) / wall for pid in before}
        result["registered_per_s"] = round(registered_per_s, 1)
        result["ttl_s"] = TTL_S
        result["cpu_per_replica"] = [round(cores[p], 3) for p in control.pids]
        result["rss_mb"] = [round(rss_mb(p), 1) for p in control.pids]
        result["etcd_cpu"] = round(sum(cores[p] for p in control.etcd_pids), 3)
        result["generator_cpu"] = round(cores[os.getpid()], 3)
        result["propagation_ms"] = await propagation(control.urls)
        steps = []
        for step_rate in args.rates:
            steps.append(await steady(posters, args.nodes, step_rate,
                                      min(args.step_s, 10.0), args.changed, started_at, rng))
            if not _sustained(steps[-1]):
                break
        ok = [s["offered_per_s"] for s in steps if _sustained(s)]
        result["max_sustained_per_s"] = max(ok) if ok else 0
        result["steps"] = steps
    finally:
        for poster in posters:
            await poster.close()
    return result


def _sustained(step: dict[str, Any]) -> bool:
    return (step["achieved_per_s"] >= 0.95 * step["offered_per_s"]
            and step["p99_ms"] <= P99_TARGET_MS and step["errors"] == 0)


def heartbeats(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for store in ("etcd", "sqlite"):
        with ExitStack() as stack:
            control = start_store(stack, store)
            out[store] = asyncio.run(heartbeat_run(control, args))
            out[store]["replicas"] = len(control.urls)
    return out


# -- cost of one heartbeat ------------------------------------------------------------------


async def cost_run(control: Control, n: int = 3000, nodes: int = 200) -> dict[str, float]:
    """Control-plane CPU per heartbeat, 32 in flight: ``n`` that repeat the node's last one,
    then ``n`` that each carry a new load figure (one replica, ``nodes`` nodes)."""
    url, pid = control.urls[0], control.pids[0]
    out = {}
    poster = LeanPoster(url, connections=32)
    try:
        await register([poster], nodes, 1.0)
        for name, changed in (("repeated", False), ("changed", True)):
            async def one(k: int, changed: bool = changed) -> None:
                i = k % nodes
                status = await poster.post(f"/v1/nodes/sim-{i:05d}/heartbeat",
                                           encoded(i, (k if changed else 0) % 8 + 1, 1.0))
                if status != 200:
                    raise RuntimeError(f"a heartbeat answered {status}")

            before, t = cpu_s(pid), time.perf_counter()
            await asyncio.gather(*(one(k) for k in range(n)))
            wall = time.perf_counter() - t
            out[f"{name}_cpu_ms"] = round((cpu_s(pid) - before) / n * 1000, 3)
            out[f"{name}_per_s"] = round(n / wall, 1)
    finally:
        await poster.close()
    return out


def cost(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for store in ("sqlite", "etcd"):
        with ExitStack() as stack:
            out[store] = asyncio.run(cost_run(start_store(stack, store, replicas=1)))
    return out


# -- failover and join ----------------------------------------------------------------------

FLEET = """
name: registry-scale
seed: 3
zoo: {profile: test}
control: {store: etcd, replicas: 2, etcd_members: 3, ttl_s: 3}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.9, fmnist-medium: 0.9}
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,   tier: device, models: [fmnist-small]}
  - {id: dev-2,   tier: device, models: [fmnist-small]}
links:
  - {from: [dev-1, dev-2], to: edge-1, delay_ms: 5}
  - {from: edge-1, to: cloud-1, delay_ms: 10}
"""


class Load:
    """Inference requests from the devices at ``rate`` per second on a thread (site privacy:
    what escalates goes to an edge); every answer kept."""

    def __init__(self, fleet: Any, images: np.ndarray, rate: float = 40.0) -> None:
        import threading

        self.fleet, self.images, self.rate = fleet, images, rate
        self.answers: list[tuple[float, int, str]] = []  # (time, status, served_by)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        from tierlink.client.sync import Client

        clients = [Client(self.fleet.node_urls[d]) for d in ("dev-1", "dev-2")]
        k = 0
        while not self._stop.is_set():
            client = clients[k % 2]
            x = self.images[k % len(self.images)][None]
            try:
                result = client.infer("fmnist", x, privacy="site", deadline_ms=2000)
                self.answers.append((time.monotonic(), 200, result.served_by))
            except Exception as exc:  # noqa: BLE001 (counted, with its status when it has one)
                self.answers.append((time.monotonic(), int(getattr(exc, "http_status", 599)),
                                     type(exc).__name__))
            k += 1
            self._stop.wait(1.0 / self.rate)


def _enroll_stream(fleet: Any, stop: Any, acked: list[tuple[str, str]],
                   failed: list[str]) -> None:
    """Enroll a new node id every 50 ms through whichever replica answers; keep the acks."""
    token = httpx.post(f"{fleet.control_url}/v1/enrollment-tokens", json={"note": "bench"},
                       headers=fleet.admin_headers, timeout=10, trust_env=False).json()["token"]
    k = 0
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        while not stop.is_set():
            node_id = f"w-{k:05d}"
            for url in fleet.control_urls:
                try:
                    r = http.post(f"{url}/v1/enroll", json={"token": token, "node_id": node_id,
                                                            "tier": "device"})
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    acked.append((node_id, r.json()["secret"]))
                    break
            else:
                failed.append(node_id)
            k += 1
            stop.wait(0.05)


def failover_and_join(args: argparse.Namespace) -> dict[str, Any]:
    import threading

    from tierlink.core.types import Tier
    from tierlink.fleet.config import NodeConfig, parse_fleet
    from tierlink.fleet.launcher import launch
    from tierlink.zoo.cache import ensure_zoo
    from tierlink.zoo.datasets import fashion_mnist

    cfg = parse_fleet(yaml.safe_load(FLEET))
    zoo = ensure_zoo(task="fmnist", profile="test", progress=False)
    models = {name: (zoo.path(name), zoo.card_path(name)) for name in zoo.cards}
    images = fashion_mnist().test.input[:400]
    run = Path(tempfile.mkdtemp(prefix="tierlink-registry-scale-fleet-"))
    with launch(cfg, models, run) as fleet, Load(fleet, images) as load:
        stop = threading.Event()
        acked: list[tuple[str, str]] = []
        refused: list[str] = []
        writer = threading.Thread(target=_enroll_stream, args=(fleet, stop, acked, refused))
        writer.start()
        time.sleep(3.0)
        fleet.kill_control(0)
        time.sleep(5.0)
        fleet.etcd.kill(0)
        time.sleep(5.0)
        stop.set()
        writer.join(30)
        lost = _lost_writes(fleet.control_urls[1], acked)
        failed = sum(1 for _, status, _ in load.answers if status != 200)
        failover = {"requests": len(load.answers), "failed": failed, "writes": len(acked),
                    "lost_writes": lost, "writes_refused": len(refused)}

        started = time.monotonic()
        fleet.add_node(NodeConfig("edge-2", Tier.EDGE, ("fmnist-medium",),
                                  labels={"site": "site-edge-1"}))
        first = None
        while time.monotonic() - started < 30:
            served = [t for t, s, by in load.answers if by == "edge-2" and t >= started]
            if served:
                first = served[0]
                break
            time.sleep(0.05)
        if first is not None:
            time.sleep(10.0)
        window = [by for t, s, by in load.answers
                  if first is not None and first <= t <= first + 10 and by.startswith("edge")]
        join = {"seconds_to_serve": None if first is None else round(first - started, 2),
                "share": round(window.count("edge-2") / len(window), 3) if window else 0.0,
                "edge_requests": len(window)}
    return {"failover": failover, "join": join}


def _lost_writes(url: str, acked: list[tuple[str, str]]) -> int:
    """Acknowledged enrollments whose credential the surviving replica does not accept."""
    lost = 0
    with httpx.Client(timeout=5.0, trust_env=False) as http:
        for node_id, secret in acked:
            r = http.get(f"{url}/v1/nodes",
                         headers={"authorization": f"Bearer node:{node_id}:{secret}"})
            lost += r.status_code != 200
    return lost


# -- main -----------------------------------------------------------------------------------


def print_table(result: dict[str, Any]) -> None:
    hb = result.get("heartbeats", {})
    if hb:
        print(f"{'store':<8}{'replicas':>9}{'offered/s':>11}{'achieved/s':>12}{'p50 ms':>8}"
              f"{'p99 ms':>8}{'CPU/replica':>14}{'RSS MB':>12}{'etcd CPU':>10}"
              f"{'prop p50':>10}{'max/s':>8}")
        for store, r in hb.items():
            print(f"{store:<8}{r['replicas']:>9}{r['offered_per_s']:>11.0f}"
                  f"{r['achieved_per_s']:>12.0f}{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}"
                  f"{'/'.join(f'{c:.2f}' for c in r['cpu_per_replica']):>14}"
                  f"{'/'.join(f'{m:.0f}' for m in r['rss_mb']):>12}{r['etcd_cpu']:>10.2f}"
                  f"{r['propagation_ms']['p50_ms']:>10.1f}{r['max_sustained_per_s']:>8.0f}")
    if "cost" in result:
        print("control-plane CPU per heartbeat (ms):", json.dumps(result["cost"]))
    if "failover" in result:
        print("failover:", json.dumps(result["failover"]))
        print("join:", json.dumps(result["join"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--step-s", type=float, default=20.0)
    parser.add_argument("--changed", type=float, default=0.1)
    parser.add_argument("--rates", default="500,1000,2000,3000,4000")
    parser.add_argument("--parts", default="cost,heartbeats,failover,join")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r]
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"nodes": args.nodes, "interval_s": args.interval,
                              "changed_share": args.changed, "cpus": os.cpu_count()}
    if "cost" in parts:
        result["cost"] = cost(args)
    if "heartbeats" in parts:
        result["heartbeats"] = heartbeats(args)
    if parts & {"failover", "join"}:
        result.update(failover_and_join(args))
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
