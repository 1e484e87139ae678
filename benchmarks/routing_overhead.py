"""What routing costs: the policy's decision time, and the latency a routing hop adds.

Part 1 — policy decision time. ``TierlinkPolicy.plan`` over ``tierlink.testing.views.fleet_view``
snapshots: device ``dev-1`` linked to 100 edges, each edge linked to 3 clouds (and the demo's
size, 2 edges and 1 cloud). Requests of the three privacy levels x deadlines 30/150/1000 ms,
interleaved; every decision timed on its own with ``time.perf_counter_ns`` after a warm-up.
Timed with the plan cache warm (``policy/plan_cache.py``: the decisions' request-independent
half kept per snapshot; its hit rate is reported) and, beside it, cold (the cache off: every
decision computed whole). Goal: p99 <= 20 us warm over 100 upstream nodes (the earlier
bound, 50 us, for a decision computed whole). ``--policy-profile`` adds a cProfile breakdown
(us per decision by function) for each privacy level.

Part 2 — the latency a hop adds, one Fashion-MNIST test image [1,1,28,28] FP32, sequential
requests on loopback, every process real (control plane + three nodes, no link emulation):

    (a) inprocess      fmnist-small in ONNX Runtime in this process (``OnnxModel``: 1 thread,
                       no spinning — what a node runs)
    (b) node_http      POST dev-1 /v2/models/fmnist-small/infer (binary tensors, ``OipClient``)
        node_http_sync the same with a plain sync ``httpx.Client`` (same codec work)
    (c) routed_local   POST dev-1 /v2/models/fmnist/infer, privacy local (policy -> local)
    (d) forwarded      POST dev-2 /v2/models/fmnist/infer, privacy site: dev-2 has no model,
                       so it forwards to edge-1, which answers with the same fmnist-small
    (e) edge_routed    POST edge-1 /v2/models/fmnist/infer directly (d minus the device's hop)
    (f) http_floor     GET dev-1 /v2/health/ready: the HTTP floor of this client and machine

Beside them, the node's own share without sockets (``app_inprocess_ms``): (f), (b) and (c)
through a node's ASGI app in this process (``NodeService`` with the same model, driven on
uvloop as a node runs, no server and no client): what the node's code costs per request.

Each case runs with ``OipClient`` (what nodes use between themselves), with a plain sync
``httpx.Client``, and over the protocol's gRPC API (``GrpcClient``: the JSON's ``grpc_ms``,
the floor there is ``ServerLive``); ratios are p50/p50 and p99/p99 against (a) and (b). Beside wall time the
script reads every process's CPU time and run-queue wait from ``/proc/PID/task/*/schedstat``
(less what each burns idle: heartbeats, view refreshes), so the work a hop adds can be told
apart from waiting for a CPU on a busy machine. Rounds interleave the cases so drift hits
them alike. Every process this script starts is stopped by pid at the end, also on error,
Ctrl-C or SIGTERM. ``--profile full`` (the default) builds the zoo first if it is missing
(minutes of CPU); ``test`` has the same architectures, so the same compute cost.

Part 3 (``--part tls``) — what TLS costs per hop: a plain fleet and one with TLS on every
hop side by side (``benchmarks/tls_cost.py``): an application's hop, a node-to-node hop,
and a new connection's handshake.

    .venv/bin/python benchmarks/routing_overhead.py [--json PATH] [--profile full|test]
        [--decisions N] [--requests N] [--part all|policy|hop|tls] [--policy-profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import pstats
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tierlink.core.types import ClusterView, Privacy, Request
from tierlink.policy import PolicyConfig, TierlinkPolicy
from tierlink.testing.views import fleet_view

if TYPE_CHECKING:
    from tierlink.node.spec import NodeSpec

HOST = "127.0.0.1"
GOAL_P99_US = 20.0  # warm plan cache
GOAL_COLD_P99_US = 50.0  # every decision computed whole
# Decisions before timing: enough for the plan cache to have seen each (case, pick) of the
# 100-edge view many times over (9 cases x 100 picks).
WARMUP = 20_000
DEADLINES_MS = (30.0, 150.0, 1000.0)
IMAGE_BYTES = 1 * 1 * 28 * 28 * 4  # one FP32 image
MODEL = "fmnist-small"
TASK = "fmnist"
READY_TIMEOUT_S = 90.0


# ---------------------------------------------------------------------------------- stats


def summary(samples: list[float] | np.ndarray) -> dict[str, float]:
    """p50 / p99 / p99.9 / mean / max of ``samples`` (same unit in, same unit out)."""
    a = np.asarray(samples, dtype=np.float64)
    p50, p99, p999 = np.percentile(a, [50, 99, 99.9])
    return {"n": int(a.size), "p50": float(p50), "p99": float(p99), "p999": float(p999),
            "mean": float(a.mean()), "max": float(a.max())}


# ------------------------------------------------------------------------- part 1: policy


@dataclass(frozen=True, slots=True)
class PolicyCase:
    """One kind of request the policy is asked to place."""

    privacy: Privacy
    deadline_ms: float

    def request(self, i: int) -> Request:
        return Request(f"r{i}", TASK, self.deadline_ms, "dev-1", self.privacy,
                       input_bytes=IMAGE_BYTES)


def policy_cases() -> list[PolicyCase]:
    return [PolicyCase(p, d) for p in Privacy for d in DEADLINES_MS]


def policy_view(edges: int, clouds: int, seed: int) -> ClusterView:
    """``fleet_view`` with uneven edge queues, so power-of-two choices has work to do."""
    rng = random.Random(seed)
    queues = {f"edge-{i}": rng.randrange(0, 8) for i in range(1, edges + 1)}
    return fleet_view(edges=edges, clouds=clouds, edge_queues=queues)


def time_decisions(view: ClusterView, decisions: int, warmup: int, seed: int,
                   clock: Callable[[], int] = time.perf_counter_ns, cache: bool = True,
                   ) -> tuple[list[PolicyCase], np.ndarray, dict[str, dict[str, int]]]:
    """Time ``decisions`` plans one by one with ``clock`` (ns), cycling through the cases in
    a shuffled order. Returns the case of every decision, its time in us (the clock's own
    cost subtracted) and how many plans of each reason every privacy level got."""
    policy = TierlinkPolicy(PolicyConfig())
    policy.cache.enabled = cache
    cases = policy_cases()
    order = [cases[i % len(cases)] for i in range(decisions)]
    random.Random(seed).shuffle(order)
    requests = [c.request(i) for i, c in enumerate(order)]  # built before timing
    rng = random.Random(seed)
    for i in range(warmup):
        policy.plan(requests[i % len(requests)], view, rng)
    times = np.empty(decisions, dtype=np.float64)
    reasons: dict[str, dict[str, int]] = {}
    for i, req in enumerate(requests):
        start = clock()
        plan = policy.plan(req, view, rng)
        times[i] = clock() - start
        by = reasons.setdefault(req.privacy.value, {})
        by[plan.reason] = by.get(plan.reason, 0) + 1
    reasons["_cache"] = {"hits": policy.cache.hits, "misses": policy.cache.misses}
    return order, (times - clock_overhead_ns(clock)) / 1000.0, reasons


def clock_overhead_ns(clock: Callable[[], int], n: int = 20_000) -> float:
    """Median cost of two back-to-back ``clock()`` calls (what one timed sample includes)."""
    samples = np.empty(n, dtype=np.float64)
    for i in range(n):
        start = clock()
        samples[i] = clock() - start
    return float(np.median(samples))


def split_stats(order: list[PolicyCase], times: np.ndarray) -> dict[str, Any]:
    """Overall, by privacy and by deadline."""
    return {"all": summary(times),
            "by_privacy": {p.value: summary(times[[c.privacy is p for c in order]])
                           for p in Privacy},
            "by_deadline": {f"{d:g}ms": summary(times[[c.deadline_ms == d for c in order]])
                            for d in DEADLINES_MS}}


def policy_result(edges: int, clouds: int, decisions: int, warmup: int, seed: int
                  ) -> dict[str, Any]:
    """Wall time per decision (``perf_counter_ns``), the headline, and the same decisions
    in thread CPU time (``thread_time_ns``): on a shared machine the first includes time
    the thread was preempted, the second does not."""
    view = policy_view(edges, clouds, seed)
    order, wall, reasons = time_decisions(view, decisions, warmup, seed)
    cache = reasons.pop("_cache")
    cpu_order, cpu, _ = time_decisions(view, decisions, warmup, seed, time.thread_time_ns)
    cold_order, cold, _ = time_decisions(view, decisions, warmup, seed, cache=False)
    stats, cpu_stats = split_stats(order, wall), split_stats(cpu_order, cpu)
    cold_stats = split_stats(cold_order, cold)
    for p, s in stats["by_privacy"].items():
        s["plans"] = reasons.get(p, {})
    overall = stats["all"]
    return {"upstream_nodes": edges, "clouds": clouds, "view_nodes": len(view.nodes),
            "decisions": decisions, "warmup": warmup, "p50_us": overall["p50"],
            "p99_us": overall["p99"], "p999_us": overall["p999"], "mean_us": overall["mean"],
            "max_us": overall["max"], "by_privacy": stats["by_privacy"],
            "by_deadline": stats["by_deadline"],
            "cpu_time": {"p50_us": cpu_stats["all"]["p50"], "p99_us": cpu_stats["all"]["p99"],
                         "p999_us": cpu_stats["all"]["p999"],
                         "by_privacy": cpu_stats["by_privacy"]},
            "cache_hit_rate": round(cache["hits"] / max(1, cache["hits"] + cache["misses"]),
                                    4),
            "cold": {"p50_us": cold_stats["all"]["p50"], "p99_us": cold_stats["all"]["p99"],
                     "p999_us": cold_stats["all"]["p999"],
                     "by_privacy": cold_stats["by_privacy"],
                     "goal_p99_us": GOAL_COLD_P99_US,
                     "goal_met": cold_stats["all"]["p99"] <= GOAL_COLD_P99_US},
            "goal_p99_us": GOAL_P99_US, "goal_met": overall["p99"] <= GOAL_P99_US,
            "goal_met_cpu_time": cpu_stats["all"]["p99"] <= GOAL_P99_US}


def measure_policy(decisions: int, warmup: int, seed: int) -> dict[str, Any]:
    big = policy_result(100, 3, decisions, warmup, seed)
    big["small_view"] = policy_result(2, 1, decisions, warmup, seed)
    big["timer_overhead_us"] = {name: clock_overhead_ns(clock) / 1e3 for name, clock in
                                (("perf_counter_ns", time.perf_counter_ns),
                                 ("thread_time_ns", time.thread_time_ns))}
    return big


def profile_policy(decisions: int, seed: int, top: int = 14) -> dict[str, list[dict[str, Any]]]:
    """cProfile of ``decisions`` plans per privacy level over the 100-edge view: the
    functions with the most own time, in us per decision (cProfile inflates every call by
    roughly the same hook cost, so compare the shares, not the absolute sum to part 1)."""
    view = policy_view(100, 3, seed)
    policy = TierlinkPolicy(PolicyConfig())
    out: dict[str, list[dict[str, Any]]] = {}
    for privacy in Privacy:
        cases = [PolicyCase(privacy, d) for d in DEADLINES_MS]
        requests = [cases[i % 3].request(i) for i in range(decisions)]
        rng = random.Random(seed)
        profiler = cProfile.Profile()
        profiler.enable()
        for req in requests:
            policy.plan(req, view, rng)
        profiler.disable()
        out[privacy.value] = profile_rows(pstats.Stats(profiler), decisions, top)
    return out


def profile_rows(stats: pstats.Stats, decisions: int, top: int) -> list[dict[str, Any]]:
    rows = []
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in \
            stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(filename).name}:{line}({func})",
                     "calls_per_decision": ncalls / decisions,
                     "own_us": tottime / decisions * 1e6, "cum_us": cumtime / decisions * 1e6})
    rows.sort(key=lambda r: -r["own_us"])
    return rows[:top]


# ------------------------------------------------------------------ part 2: processes


@dataclass
class Processes:
    """Child processes started here, stopped by pid (nodes first, control plane last)."""

    run_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.run_dir / f"{name}.log", "wb")  # noqa: SIM115 (the child owns it)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        # Own session: a terminal's Ctrl-C reaches only this script, which stops them in order.
        proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def stop(self, timeout_s: float = 5.0) -> None:
        order = [n for n in self.procs if n != "control"] + ["control"]
        live = [self.procs[n] for n in order if n in self.procs]
        for proc in live:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in live:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def wait_ready(self, name: str, ready: Path) -> dict[str, Any]:
        """The JSON a child writes to ``ready`` once it serves; fails fast if it exits."""
        proc = self.procs[name]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if ready.exists():
                return dict(json.loads(ready.read_text()))
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode} before it was "
                                   f"ready; see {self.run_dir / (name + '.log')}")
            time.sleep(0.05)
        raise RuntimeError(f"{name} was not ready after {READY_TIMEOUT_S:.0f} s; see "
                           f"{self.run_dir / (name + '.log')}")


@contextmanager
def stop_on_signal(cleanup: Callable[[], None]) -> Iterator[None]:
    """On SIGTERM or SIGINT: run ``cleanup`` at once, then raise ``KeyboardInterrupt``.

    Cleaning up inside the handler, not only in a ``finally``: Python runs the handler at
    the next bytecode, which may be inside a callback (a weakref's, a ``__del__``) whose
    exceptions are printed and swallowed, and the children would outlive the script."""
    def handler(signum: int, frame: object) -> None:
        cleanup()
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass(frozen=True, slots=True)
class Fleet:
    control_url: str
    urls: dict[str, str]  # node id -> base URL
    pids: dict[str, int]  # process name -> pid ("client" is this script)
    grpc: dict[str, str] = field(default_factory=dict)  # node id -> host:port of its gRPC API


def start_fleet(procs: Processes, onnx: Path, card: Path) -> Fleet:
    """Control plane; edge-1 and dev-1 serving fmnist-small; dev-2 with no model. Both
    devices link straight to edge-1 (no emulator): nothing but routing between them."""
    from tierlink.core.types import Tier
    from tierlink.node.spec import ModelSource, NodeSpec, UpstreamSpec

    ready = procs.run_dir / "control.ready"
    procs.spawn("control", ["-m", "tierlink.control.server", "--host", HOST, "--port", "0",
                            "--db", str(procs.run_dir / "registry.db"), "--ready-file",
                            str(ready), "--open"])
    control_url = f"http://{HOST}:{procs.wait_ready('control', ready)['port']}"
    model = (ModelSource(MODEL, str(onnx), str(card)),)
    urls: dict[str, str] = {}
    grpc: dict[str, str] = {}
    edge = NodeSpec("edge-1", Tier.EDGE, model, control_url=control_url)
    urls["edge-1"], grpc["edge-1"] = start_node(procs, edge)
    up = (UpstreamSpec("edge-1", urls["edge-1"], rtt_ms=0.2, bandwidth_mbit=10_000.0),)
    urls["dev-1"], grpc["dev-1"] = start_node(procs, NodeSpec(
        "dev-1", Tier.DEVICE, model, control_url=control_url, upstreams=up))
    urls["dev-2"], grpc["dev-2"] = start_node(procs, NodeSpec(
        "dev-2", Tier.DEVICE, (), control_url=control_url, upstreams=up))
    wait_learned(urls["dev-2"], "edge-1")
    pids = {"client": os.getpid(), **{name: p.pid for name, p in procs.procs.items()}}
    return Fleet(control_url, urls, pids, grpc)


def start_node(procs: Processes, spec: NodeSpec) -> tuple[str, str]:
    """The node's REST base URL and its gRPC API's ``host:port``."""
    from dataclasses import replace

    ready = procs.run_dir / f"{spec.node_id}.ready"
    spec = replace(spec, host=HOST, port=0, grpc_port=0, ready_file=str(ready))
    spec_file = procs.run_dir / f"{spec.node_id}.json"
    spec_file.write_text(spec.to_json())
    procs.spawn(spec.node_id, ["-m", "tierlink.node.main", "--spec", str(spec_file)])
    info = procs.wait_ready(spec.node_id, ready)
    return f"http://{HOST}:{info['port']}", f"{HOST}:{info['grpc_port']}"


def wait_learned(url: str, upstream: str) -> None:
    """Until the node at ``url`` sees ``upstream`` (and so its models) in its view."""
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            status = client.get(f"{url}/tierlink/v1/status").json()
            if upstream in status["view_nodes"] and TASK in status["tasks"]:
                return
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not learn {upstream} from the control plane in time")


# -------------------------------------------------------------------- part 2: timing


@dataclass(frozen=True, slots=True)
class HopCase:
    key: str  # JSON key without the _ms suffix
    label: str
    node: str
    model: str | None  # None: GET /v2/health/ready, the HTTP floor (no body, no model)
    params: dict[str, Any]


def hop_cases() -> list[HopCase]:
    """(b)..(e), then the floor. (b) first: ratios are taken against it."""
    routed = {"tierlink.deadline_ms": 1000}
    return [
        HopCase("node_http", "(b) node model", "dev-1", MODEL, {}),
        HopCase("routed_local", "(c) routed local", "dev-1", TASK,
                {**routed, "tierlink.privacy": "local"}),
        HopCase("forwarded", "(d) forwarded", "dev-2", TASK,
                {**routed, "tierlink.privacy": "site"}),
        HopCase("edge_routed", "(e) edge routed", "edge-1", TASK,
                {**routed, "tierlink.privacy": "site"}),
        HopCase("http_floor", "(f) health GET", "dev-1", None, {}),
    ]


def load_image() -> np.ndarray:
    """The first Fashion-MNIST test image, (1, 1, 28, 28) float32 in [0, 1]."""
    from tierlink.zoo.datasets import DEFAULT_ROOT, read_idx

    images = read_idx(DEFAULT_ROOT / "t10k-images-idx3-ubyte.gz", 3)  # (N, 28, 28) uint8
    return (images[:1].astype(np.float32) / 255.0)[:, None, :, :]  # (1, 1, 28, 28)


@dataclass(frozen=True, slots=True)
class Snapshot:
    wall_ns: int
    procs: dict[str, tuple[int, int]]  # name -> (ns on a CPU, ns waiting for one)


class CpuMeter:
    """CPU time and run-queue wait of a set of processes, from ``/proc/PID/task/*/schedstat``
    (ns: time on a CPU, time runnable but waiting for one). On a shared machine the wall
    time of a request is mostly waiting; the CPU it burns is the work a hop really adds."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    @staticmethod
    def available() -> bool:
        return Path(f"/proc/{os.getpid()}/schedstat").exists()

    def snapshot(self) -> Snapshot:
        return Snapshot(time.perf_counter_ns(),
                        {name: self._read(pid) for name, pid in self.pids.items()})

    def idle(self, samples: Samples, seconds: float = 1.0) -> None:
        """Record what the processes burn with no requests (subtracted per request later)."""
        before = self.snapshot()
        time.sleep(seconds)
        samples.add_cpu("idle", self, before, 1)

    @staticmethod
    def _read(pid: int) -> tuple[int, int]:
        run = wait = 0
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                fields = stat.read_text().split()
            except OSError:  # a thread ended between glob and read
                continue
            run, wait = run + int(fields[0]), wait + int(fields[1])
        return run, wait


def time_inprocess(onnx: Path, card: Path, x: np.ndarray, n: int, warmup: int,
                   samples: Samples, meter: CpuMeter | None) -> None:
    from tierlink.models.onnx import OnnxModel
    from tierlink.models.runtime import ModelInfo

    model = OnnxModel(onnx, ModelInfo.from_card(card), threads=1)
    feed = {model.inputs[0].name: x}
    for _ in range(warmup):
        model.infer(feed)
    before = meter.snapshot() if meter else None
    clock = time.perf_counter_ns
    for _ in range(n):
        start = clock()
        model.infer(feed)
        samples.add("inprocess", (clock() - start) / 1e6, {})
    samples.add_cpu("inprocess", meter, before, n)


APP_CASES = (("app_floor", "GET", "/v2/health/ready", None),
             ("app_model", "POST", f"/v2/models/{MODEL}/infer", {}),
             ("app_routed", "POST", f"/v2/models/{TASK}/infer",
              {"tierlink.deadline_ms": 1000, "tierlink.privacy": "local"}))


def time_app(onnx: Path, card: Path, x: np.ndarray, n: int, warmup: int,
             samples: Samples) -> None:
    """The floor, the model endpoint and a routed request through a node's ASGI app in this
    process: the node's code alone, no sockets (``APP_CASES``)."""
    import uvloop

    from tierlink.core.types import Tier
    from tierlink.models.onnx import OnnxModel
    from tierlink.models.runtime import ModelInfo
    from tierlink.node.app import create_app
    from tierlink.node.service import NodeService
    from tierlink.node.spec import NodeSpec
    from tierlink.transport import oip

    async def main() -> None:
        model = OnnxModel(onnx, ModelInfo.from_card(card), threads=1)
        app = create_app(NodeService(NodeSpec("dev-1", Tier.DEVICE, ()), {MODEL: model}),
                         ready=True)
        async with app.router.lifespan_context(app):
            for key, method, path, params in APP_CASES:
                body, headers = (b"", {}) if params is None else \
                    oip.encode_infer_request({"input": x}, params or None, None)
                for i in range(warmup + n):
                    start = time.perf_counter_ns()
                    await asgi_call(app, method, path, body, headers)
                    if i >= warmup:
                        samples.add(key, (time.perf_counter_ns() - start) / 1e6, {})

    uvloop.run(main())


async def asgi_call(app: Any, method: str, path: str, body: bytes,
                    headers: dict[str, str]) -> None:
    """One request through ``app`` as a server would hand it over; raises unless 200."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:  # the app reads no further: a request's body came in one message
            raise RuntimeError("the app asked for more than the request's body")
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in
           {**headers, "content-length": str(len(body))}.items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": raw,
             "server": (HOST, 0), "client": (HOST, 0), "state": {}}
    await app(scope, receive, send)
    if sent[0]["status"] != 200:
        raise RuntimeError(f"{method} {path} answered {sent[0]['status']}: {sent[1:]}")


@dataclass
class Samples:
    """Per-case latencies (ms), the node's own ``tierlink.server_ms`` when it sends one,
    who answered, and CPU / run-queue ns per process over the timed requests, with the
    wall time they took (to take off what the processes burn when idle: heartbeats, view
    refreshes, the control plane)."""

    ms: dict[str, list[float]] = field(default_factory=dict)
    server_ms: dict[str, list[float]] = field(default_factory=dict)
    answered_by: dict[str, set[str]] = field(default_factory=dict)
    cpu_ns: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    cpu_requests: dict[str, int] = field(default_factory=dict)
    cpu_wall_ns: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, ms: float, params: dict[str, Any]) -> None:
        self.ms.setdefault(key, []).append(ms)
        if "tierlink.server_ms" in params:
            self.server_ms.setdefault(key, []).append(float(params["tierlink.server_ms"]))
        if "tierlink.served_by" in params:
            self.answered_by.setdefault(key, set()).add(str(params["tierlink.served_by"]))

    def add_cpu(self, key: str, meter: CpuMeter | None, before: Snapshot | None,
                n: int) -> None:
        """Fold in the CPU the processes used since ``before``, over ``n`` requests."""
        if meter is None or before is None:
            return
        after = meter.snapshot()
        acc = self.cpu_ns.setdefault(key, {})
        for name, (run, wait) in after.procs.items():
            tot = acc.setdefault(name, [0, 0])
            tot[0] += run - before.procs[name][0]
            tot[1] += wait - before.procs[name][1]
        self.cpu_requests[key] = self.cpu_requests.get(key, 0) + n
        self.cpu_wall_ns[key] = self.cpu_wall_ns.get(key, 0) + after.wall_ns - before.wall_ns

    def cpu_per_request(self, key: str) -> dict[str, Any] | None:
        """CPU ms per request by process, less what the process burns idle (``idle`` key)."""
        acc, n = self.cpu_ns.get(key), self.cpu_requests.get(key, 0)
        idle, idle_wall = self.cpu_ns.get("idle"), self.cpu_wall_ns.get("idle", 0)
        if not acc or not n:
            return None
        wall = self.cpu_wall_ns[key]
        per: dict[str, dict[str, float]] = {}
        for name, (run, wait) in acc.items():
            background = idle[name][0] / idle_wall * wall if idle and idle_wall else 0.0
            per[name] = {"cpu_ms": max(0.0, run - background) / n / 1e6,
                         "cpu_ms_raw": run / n / 1e6, "runqueue_wait_ms": wait / n / 1e6}
        return {"cpu_ms": sum(v["cpu_ms"] for v in per.values()),
                "runqueue_wait_ms": sum(v["runqueue_wait_ms"] for v in per.values()),
                "by_process": per}


def async_call(client: Any, url: str, case: HopCase, x: np.ndarray
               ) -> Callable[[], Awaitable[dict[str, Any]]]:
    """One request through ``OipClient``; returns the response's parameters."""
    async def call() -> dict[str, Any]:
        if case.model is None:
            if not await client.ready(url):
                raise RuntimeError(f"{url} is not ready")
            return {}
        resp = await client.infer(url, case.model, {"input": x}, case.params or None)
        return dict(resp.parameters)

    return call


def grpc_call(client: Any, case: HopCase, x: np.ndarray
              ) -> Callable[[], Awaitable[dict[str, Any]]]:
    """One request over the gRPC API (``GrpcClient``); the floor is ``ServerLive``."""
    async def call() -> dict[str, Any]:
        if case.model is None:
            if not await client.live():
                raise RuntimeError(f"{client.target} is not live")
            return {}
        resp = await client.infer(case.model, {"input": x}, case.params or None)
        return dict(resp.parameters)

    return call


def sync_call(client: Any, url: str, case: HopCase, x: np.ndarray) -> Callable[[], dict[str, Any]]:
    """One request with a plain ``httpx.Client``: the same encode / POST / decode as
    ``OipClient`` does, without asyncio and the error mapping."""
    from tierlink.transport.oip import HEADER_LENGTH, decode_infer_response, encode_infer_request

    if case.model is None:
        def health() -> dict[str, Any]:
            client.get(f"{url}/v2/health/ready").raise_for_status()
            return {}

        return health
    target = f"{url}/v2/models/{case.model}/infer"

    def call() -> dict[str, Any]:
        body, headers = encode_infer_request({"input": x}, case.params or None, None)
        resp = client.post(target, content=body, headers=headers)
        resp.raise_for_status()
        header = resp.headers.get(HEADER_LENGTH)
        decoded = decode_infer_response(resp.content, None if header is None else int(header))
        return decoded.parameters

    return call


@dataclass(frozen=True, slots=True)
class Block:
    """What one block of sequential requests needs: how many, and where to record them."""

    n: int
    warmup: int
    samples: Samples
    meter: CpuMeter | None


async def run_async_block(key: str, call: Callable[[], Awaitable[dict[str, Any]]],
                          block: Block) -> None:
    for _ in range(block.warmup):
        await call()
    before = block.meter.snapshot() if block.meter else None
    clock = time.perf_counter_ns
    for _ in range(block.n):
        start = clock()
        params = await call()
        block.samples.add(key, (clock() - start) / 1e6, params)
    block.samples.add_cpu(key, block.meter, before, block.n)


def run_sync_block(key: str, call: Callable[[], dict[str, Any]], block: Block) -> None:
    for _ in range(block.warmup):
        call()
    before = block.meter.snapshot() if block.meter else None
    clock = time.perf_counter_ns
    for _ in range(block.n):
        start = clock()
        params = call()
        block.samples.add(key, (clock() - start) / 1e6, params)
    block.samples.add_cpu(key, block.meter, before, block.n)


async def run_round(fleet: Fleet, x: np.ndarray, block: Block, sync_client: Any) -> None:
    """One round: every case with ``OipClient``, then over gRPC, then with the sync
    client."""
    from tierlink.transport.client import OipClient
    from tierlink.transport.grpc_client import GrpcClient

    async with OipClient(timeout_s=10.0) as client:
        for case in hop_cases():
            await run_async_block(case.key, async_call(client, fleet.urls[case.node], case, x),
                                  block)
    for case in hop_cases():
        async with GrpcClient(fleet.grpc[case.node]) as grpc_client:
            await run_async_block(f"{case.key}_grpc", grpc_call(grpc_client, case, x), block)
    for case in hop_cases():
        run_sync_block(f"{case.key}_sync", sync_call(sync_client, fleet.urls[case.node],
                                                     case, x), block)


def measure_hops(onnx: Path, card: Path, requests: int, rounds: int, warmup: int,
                 say: Callable[[str], None]) -> dict[str, Any]:
    """Start the fleet, run ``rounds`` interleaved rounds, stop every process it started."""
    x = load_image()
    per_round = max(1, -(-requests // rounds))
    with tempfile.TemporaryDirectory(prefix="tierlink-hop-") as tmp:
        procs = Processes(Path(tmp))
        try:
            with stop_on_signal(procs.stop):
                fleet = start_fleet(procs, onnx, card)
                say(f"fleet up: control {fleet.control_url}, nodes {fleet.urls}")
                samples = run_rounds(fleet, onnx, card, x, per_round, rounds, warmup, say)
        finally:
            procs.stop()
            say(f"stopped {len(procs.procs)} processes "
                f"({', '.join(f'{k}={p.pid}' for k, p in procs.procs.items())})")
    return hop_result(samples, per_round * rounds)


def run_rounds(fleet: Fleet, onnx: Path, card: Path, x: np.ndarray, per_round: int,
               rounds: int, warmup: int, say: Callable[[str], None]) -> Samples:
    import httpx

    meter = CpuMeter(fleet.pids) if CpuMeter.available() else None
    block = Block(per_round, warmup, Samples(), meter)
    with httpx.Client(timeout=10.0, trust_env=False,
                      headers={"Accept-Encoding": "identity"}) as sync_client:
        for r in range(rounds):
            if meter:
                meter.idle(block.samples)
            time_inprocess(onnx, card, x, per_round, warmup, block.samples, meter)
            time_app(onnx, card, x, per_round, warmup, block.samples)
            asyncio.run(run_round(fleet, x, block, sync_client))
            say(f"round {r + 1}/{rounds} done")
    return block.samples


def hop_result(samples: Samples, requests: int) -> dict[str, Any]:
    def pq(values: Any) -> dict[str, float]:
        s = summary(values)
        return {"p50": s["p50"], "p99": s["p99"], "mean": s["mean"], "n": s["n"]}

    keys = ["inprocess"] + [c.key for c in hop_cases()]
    out: dict[str, Any] = {"requests": requests}
    out.update({f"{k}_ms": pq(samples.ms[k]) for k in keys})
    out["node_http_sync_ms"] = pq(samples.ms["node_http_sync"])
    out["sync_client_ms"] = {c.key: pq(samples.ms[f"{c.key}_sync"]) for c in hop_cases()}
    out["grpc_ms"] = {c.key: pq(samples.ms[f"{c.key}_grpc"]) for c in hop_cases()}
    out["app_inprocess_ms"] = {key: pq(samples.ms[key]) for key, *_ in APP_CASES}
    out["server_ms"] = {k: pq(v) for k, v in samples.server_ms.items()
                        if not k.endswith(("_sync", "_grpc"))}
    out["served_by"] = {k: sorted(v) for k, v in samples.answered_by.items()
                        if not k.endswith("_sync")}
    grpc_keys = [f"{c.key}_grpc" for c in hop_cases()]
    cpu = {k: samples.cpu_per_request(k) for k in [*keys, "node_http_sync", *grpc_keys]}
    out["cpu_per_request"] = {k: v for k, v in cpu.items() if v is not None}
    idle, idle_wall = samples.cpu_ns.get("idle", {}), samples.cpu_wall_ns.get("idle", 0)
    out["idle_cpu_ms_per_s"] = {name: run / idle_wall * 1e3 for name, (run, _) in idle.items()
                                if idle_wall}
    out["ratios"] = ratios(out)
    out["lean_hop"] = lean_hop(out)
    return out


LEAN_LOCAL, LEAN_FORWARDED = 2.5, 6.0  # p50 over the HTTP floor's, OIP-client lane


def lean_hop(out: dict[str, Any]) -> dict[str, Any]:
    """The hop's bound: a routed answer and a forwarded one against the HTTP floor of the
    same client (``OipClient``), p50 over p50; the same over gRPC beside it."""
    floor = out["http_floor_ms"]["p50"]
    local, forwarded = out["routed_local_ms"]["p50"] / floor, out["forwarded_ms"]["p50"] / floor
    grpc = out["grpc_ms"]
    return {"routed_local_over_floor": round(local, 3),
            "forwarded_over_floor": round(forwarded, 3),
            "bound": f"routed_local <= {LEAN_LOCAL}x and forwarded <= {LEAN_FORWARDED}x the "
                     "HTTP floor (p50, OipClient)",
            "met": local <= LEAN_LOCAL and forwarded <= LEAN_FORWARDED,
            "grpc": {"routed_local_over_floor": round(grpc["routed_local"]["p50"]
                                                      / grpc["http_floor"]["p50"], 3),
                     "forwarded_over_floor": round(grpc["forwarded"]["p50"]
                                                   / grpc["http_floor"]["p50"], 3)}}


def ratios(out: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each case's p50 and p99 over (a) in-process and over (b) node HTTP (OipClient), its
    p50 above the HTTP floor (f) of the same client (what the request itself costs), and
    its CPU per request (all processes) over (a)'s and (b)'s."""
    a, b = out["inprocess_ms"], out["node_http_ms"]
    floors = {"": out["http_floor_ms"]["p50"],
              "_sync": out["sync_client_ms"]["http_floor"]["p50"]}
    cpu = {k: v["cpu_ms"] for k, v in out["cpu_per_request"].items()}
    keys = ["node_http", "node_http_sync"] + [c.key for c in hop_cases()[1:]]
    result = {}
    for k in keys:
        s = out[f"{k}_ms"]
        r = {"p50_vs_inprocess": s["p50"] / a["p50"], "p99_vs_inprocess": s["p99"] / a["p99"],
             "p50_vs_node_http": s["p50"] / b["p50"], "p99_vs_node_http": s["p99"] / b["p99"],
             "p50_above_floor_ms": s["p50"] - floors["_sync" if k.endswith("_sync") else ""]}
        if k in cpu and cpu.get("inprocess") and cpu.get("node_http"):
            r["cpu_vs_inprocess"] = cpu[k] / cpu["inprocess"]
            r["cpu_vs_node_http"] = cpu[k] / cpu["node_http"]
        result[k] = r
    return result


# ------------------------------------------------------------------------------ output


def python_call_ns(n: int = 200_000) -> float:
    """ns per call of an empty Python function (best of 5): how fast this interpreter and
    CPU were during the run, to compare runs on different or busier machines."""
    def f() -> None:
        pass

    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter_ns() - start) / n)
    return best


def environment(profile: str, card: Path | None, load_start: list[float]) -> dict[str, Any]:
    import httpx

    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "loadavg_1_5_15_start": load_start,
        "loadavg_1_5_15_end": list(os.getloadavg()), "python_call_ns": python_call_ns(),
        "numpy": np.__version__, "httpx": httpx.__version__, "zoo_profile": profile,
        "gc_enabled_during_timing": True,
        "note": "shared machine: other agents' jobs ran at the same time (see loadavg)",
    }
    try:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    if card is not None:
        doc = json.loads(card.read_text())
        env["model"] = {"name": doc.get("name"), "params": doc.get("params"),
                        "card_latency_ms": doc.get("latency_ms")}
    return env


def print_policy(console: Any, pol: dict[str, Any]) -> None:
    from rich.table import Table

    over = pol["timer_overhead_us"]
    table = Table(title=f"policy.plan(), us per decision (wall: perf_counter_ns; cpu: "
                        f"thread_time_ns; clock cost subtracted: {over['perf_counter_ns']:.2f} "
                        f"/ {over['thread_time_ns']:.2f} us)")
    for col in ("view", "privacy", "n", "wall p50", "wall p99", "wall p99.9", "cpu p50",
                "cpu p99", "cpu p99.9"):
        table.add_column(col, justify="left" if col in ("view", "privacy") else "right")
    for res in (pol, pol["small_view"]):
        name = f"{res['upstream_nodes']}e x {res['clouds']}c"
        cpu = res["cpu_time"]
        rows = [(k, s, cpu["by_privacy"][k]) for k, s in res["by_privacy"].items()]
        rows.append(("[b]all[/b]", {"n": res["decisions"], "p50": res["p50_us"],
                                    "p99": res["p99_us"], "p999": res["p999_us"]},
                     {"p50": cpu["p50_us"], "p99": cpu["p99_us"], "p999": cpu["p999_us"]}))
        for key, s, c in rows:
            table.add_row(name, key, str(s["n"]), *(f"{v:.1f}" for v in (
                s["p50"], s["p99"], s["p999"], c["p50"], c["p99"], c["p999"])))
        table.add_section()
    console.print(table)
    for res in (pol, pol["small_view"]):
        plans = "; ".join(f"{k}: " + ", ".join(f"{r} x{n}" for r, n in s["plans"].items())
                          for k, s in res["by_privacy"].items())
        console.print(f"plans ({res['upstream_nodes']} edges): {plans}")
    cold = pol["cold"]
    console.print(f"plan cache: {100 * pol['cache_hit_rate']:.1f}% of decisions found warm; "
                  f"cold (cache off) p50 {cold['p50_us']:.1f} us, p99 {cold['p99_us']:.1f} us "
                  f"(goal <= {cold['goal_p99_us']:g}: {'met' if cold['goal_met'] else 'NOT met'})")
    console.print(f"goal p99 <= {GOAL_P99_US:g} us warm over 100 upstream nodes: wall "
                  f"{'met' if pol['goal_met'] else 'NOT met'} (p99 {pol['p99_us']:.1f} us), "
                  f"cpu time {'met' if pol['goal_met_cpu_time'] else 'NOT met'} "
                  f"(p99 {pol['cpu_time']['p99_us']:.1f} us)")


def print_profile(console: Any, prof: dict[str, list[dict[str, Any]]]) -> None:
    from rich.table import Table

    for privacy, rows in prof.items():
        table = Table(title=f"cProfile, privacy={privacy}: us per decision (inflated by "
                            f"the profiler's per-call hook)")
        for col in ("function", "calls/decision", "own us", "cum us"):
            table.add_column(col, justify="left" if col == "function" else "right")
        for r in rows:
            table.add_row(r["function"], f"{r['calls_per_decision']:.1f}",
                          f"{r['own_us']:.2f}", f"{r['cum_us']:.2f}")
        console.print(table)


def print_hops(console: Any, hop: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"one image [1,1,28,28] FP32, {MODEL}, loopback, sequential, "
                        f"{hop['requests']} requests per case (ratios: p50/p50, p99/p99)")
    for col in ("case", "p50 ms", "p99 ms", "node ms p50", "p50-(f)", "x(a) p50", "x(a) p99",
                "x(b) p50", "x(b) p99", "cpu ms/req", "cpu x(b)", "runq ms/req"):
        table.add_column(col, justify="left" if col == "case" else "right")
    rows = [("inprocess", "(a) in-process"), ("node_http", "(b) node model"),
            ("node_http_sync", "(b') sync httpx")] + \
           [(c.key, c.label) for c in hop_cases()[1:]]
    for key, label in rows:
        table.add_row(label, *hop_cells(hop, key))
    console.print(table)
    sync = ", ".join(f"{k} {v['p50']:.3f}/{v['p99']:.3f}" for k, v in
                     hop["sync_client_ms"].items())
    console.print(f"sync httpx client, p50/p99 ms: {sync}")
    grpc = ", ".join(f"{k} {v['p50']:.3f}/{v['p99']:.3f}" for k, v in hop["grpc_ms"].items())
    console.print(f"gRPC (GrpcClient), p50/p99 ms: {grpc}")
    app = ", ".join(f"{k} {v['p50']:.3f}/{v['p99']:.3f}" for k, v in
                    hop["app_inprocess_ms"].items())
    console.print(f"the node's ASGI app in process (no sockets), p50/p99 ms: {app}")
    lean = hop["lean_hop"]
    console.print(f"lean hop ({lean['bound']}): routed local x{lean['routed_local_over_floor']}"
                  f", forwarded x{lean['forwarded_over_floor']}: "
                  f"{'MET' if lean['met'] else 'NOT MET'}; over gRPC x"
                  f"{lean['grpc']['routed_local_over_floor']}, x"
                  f"{lean['grpc']['forwarded_over_floor']}")
    console.print(f"served by: {hop['served_by']}")
    idle = ", ".join(f"{n} {v:.1f}" for n, v in hop["idle_cpu_ms_per_s"].items())
    console.print(f"idle CPU, ms per s (taken off the per-request CPU): {idle}")
    for key, cpu in hop["cpu_per_request"].items():
        parts = ", ".join(f"{n} {v['cpu_ms']:.3f}" for n, v in cpu["by_process"].items()
                          if v["cpu_ms"] >= 0.005)
        console.print(f"cpu ms/request {key}: {parts}")


def hop_cells(hop: dict[str, Any], key: str) -> list[str]:
    s = hop[f"{key}_ms"]
    r = hop["ratios"].get(key)
    server = hop["server_ms"].get(key)
    cpu = hop["cpu_per_request"].get(key)
    cells = [f"{s['p50']:.3f}", f"{s['p99']:.3f}", f"{server['p50']:.3f}" if server else ""]
    if r is None:  # (a) itself
        cells += ["", "1.0", "1.0", "", ""]
    else:
        cells += [f"{r['p50_above_floor_ms']:.3f}", f"{r['p50_vs_inprocess']:.1f}",
                  f"{r['p99_vs_inprocess']:.1f}", f"{r['p50_vs_node_http']:.2f}",
                  f"{r['p99_vs_node_http']:.2f}"]
    ratio = "" if r is None or "cpu_vs_node_http" not in r else f"{r['cpu_vs_node_http']:.2f}"
    cells += [f"{cpu['cpu_ms']:.3f}", ratio, f"{cpu['runqueue_wait_ms']:.3f}"] if cpu \
        else ["", "", ""]
    return cells


# -------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--profile", default="full", help="zoo build profile (full | test)")
    parser.add_argument("--decisions", type=int, default=30_000,
                        help="timed decisions per view (>= 20000 for a stable p99.9)")
    parser.add_argument("--requests", type=int, default=300,
                        help="timed requests per hop case, after warm-up")
    parser.add_argument("--rounds", type=int, default=6,
                        help="interleaved rounds the requests are split into")
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed requests per case and round")
    parser.add_argument("--part", choices=("all", "policy", "hop", "tls"), default="all",
                        help="tls: what TLS costs per hop, plain and TLS fleets side by "
                             "side (benchmarks/tls_cost.py; not part of all)")
    parser.add_argument("--policy-profile", action="store_true",
                        help="add a cProfile breakdown of the policy per privacy level")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.decisions < 1 or args.requests < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--decisions, --requests and --rounds must be >= 1, --warmup >= 0")
    return args


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    card: Path | None = None
    load_start = list(os.getloadavg())
    if args.part in ("all", "policy"):
        doc["policy"] = measure_policy(args.decisions, max(WARMUP, args.decisions // 5),
                                       args.seed)
        print_policy(console, doc["policy"])
        if args.policy_profile:
            doc["policy"]["profile"] = profile_policy(5000, args.seed)
            print_profile(console, doc["policy"]["profile"])
    if args.part in ("all", "hop"):
        from tierlink.zoo.cache import ensure_zoo

        zoo = ensure_zoo(task=TASK, profile=args.profile, progress=True)
        onnx, card = zoo.path(MODEL), zoo.card_path(MODEL)
        doc["hop"] = measure_hops(onnx, card, args.requests, args.rounds, args.warmup,
                                  lambda m: console.print(f"[dim]{m}[/dim]"))
        print_hops(console, doc["hop"])
    if args.part == "tls":
        import tls_cost  # benchmarks/ is on the path when this file runs as a script

        doc["tls"] = tls_cost.measure(max(30, args.requests // args.rounds), args.rounds,
                                      lambda m: console.print(f"[dim]{m}[/dim]"))
        tls_cost.print_table(doc["tls"])
    doc["environment"] = environment(args.profile, card, load_start)
    return doc


def main(argv: list[str] | None = None) -> None:
    from rich.console import Console

    args = parse_args(argv)
    # Not a terminal (CI logs, a pipe): wide enough that the tables do not wrap.
    console = Console(width=None if sys.stdout.isatty() else 150)
    doc = run(args, console)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
