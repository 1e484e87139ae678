"""tierlink's node beside MLServer and KServe: the same ONNX model, the same client load.

Three real server processes on loopback serve one ONNX file with ONNX Runtime, each session
opened with the node's options (``benchmarks/peers/ort_session.py``: one intra-op thread, one
inter-op thread, no spinning, CPU provider):

    tierlink   ``tierlink node --spec SPEC.json`` (tier cloud, no control plane, one scheduler
               worker); ``POST /v2/models/<name>/infer`` runs the model unrouted
    mlserver   ``mlserver start`` with the runtime ``peers/mlserver_onnx.py``;
               ``parallel_workers: 0`` (inference in the server process, no worker pool)
    kserve     ``kserve.ModelServer`` with ``peers/kserve_onnx.py``; ``--workers 1``, gRPC off

MLServer and KServe run from virtualenvs of their own (``~/.cache/tierlink/peers/<name>-venv``,
made on first use: their pinned versions plus the project's onnxruntime, numpy and httptools),
so their pins never touch the project's venv. No server logs a line per request.

The load is ``tritonclient.http`` (geventhttpclient; one client per cell, ``C`` greenlets each
sending its next request when its last one is answered), batch 1, random inputs of the
model's own signature, binary tensors in and out. MLServer 1.7's REST server does not take
binary tensors (it answers 422), so it is driven with JSON tensors, and so is a second lane
on the same tierlink node (``tierlink-json``): each peer is compared with tierlink on its own
wire format. Lanes x concurrencies (1, 8, 32) alternate within each round, the lane order
rotating from round to round, so machine noise hits all of them alike. A cell: a warm-up,
then ``--duration`` seconds measured: p50 / p99 of the request wall time, requests per
second, and the server's CPU ms per request (user + system time of its process tree from
``/proc`` before and after, over the requests answered), and beside them the client's CPU
ms per request and the cores the rest of the machine used meanwhile (``/proc/stat`` less
the server and the client: how noisy the cell was). Reported: the median over rounds, with
each round's figures and the spread.

Bound (the verdict): at each concurrency, tierlink's throughput >= 0.9x the best peer's on
the same wire format and its p99 <= 1.1x the best (lowest) peer p99.

Batching (``--part batching``, the JSON's ``batching``): MobileNetV2 at 224x224, where compute
dominates, on three more servers with the same thread budget (``--threads`` intra-op threads,
one model run at a time): a tierlink node without batching, one with ``batching: {max_batch:
8}``, and MLServer with its adaptive batching (``max_batch_size`` 8), all three driven over
the protocol's gRPC API (``tritonclient.grpc``'s asyncio client, binary tensors). ONNX Runtime's own gain from batching is measured
first, in this process with the same session options (``ort_batch_gain``: images/s at batch
8 over batch 1). Bound: at 8 and 32 clients tierlink's batched/unbatched throughput >= 0.9x
``ort_batch_gain``, and against MLServer's adaptive batching throughput >= 0.95x and p99 <=
1.1x its p99.

    .venv/bin/python benchmarks/peers.py [--json PATH] [--part all|peers|batching]
        [--model-name NAME --onnx PATH --card PATH] [--rounds 4] [--duration 6]
        [--warmup 1] [--concurrency 1,8,32] [--shape INPUT=1,3,224,224]

Every process this script starts is stopped by pid at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = Path(__file__).resolve().parent / "peers"
VENVS = Path.home() / ".cache" / "tierlink" / "peers"

# The peers' own pins; onnxruntime, numpy and httptools are pinned to the project venv's
# versions (same kernels; same HTTP parser under uvicorn's http="auto" in all three servers:
# MLServer's requirements do not pull httptools in, and without it uvicorn parses with h11).
PEER_PINS: dict[str, tuple[str, ...]] = {
    "mlserver": ("mlserver==1.7.1",),
    "kserve": ("kserve==0.21.0",),
}
SHARED_PINS = ("onnxruntime", "numpy", "httptools")
RPS_FLOOR = 0.9  # tierlink rps >= 0.9 x the best peer's
P99_CEILING = 1.1  # tierlink p99 <= 1.1 x the best peer's
READY_TIMEOUT_S = 180.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Lane:
    """One server driven with one wire format; ``name`` keys the results."""

    name: str
    server: str
    binary: bool
    grpc: bool = False  # the Open Inference Protocol's gRPC API, not REST


LANES = (Lane("tierlink", "tierlink", True), Lane("kserve", "kserve", True),
         Lane("tierlink-json", "tierlink", False), Lane("mlserver", "mlserver", False))
# Each tierlink lane against the peers driven the same way.
COMPARISONS: dict[str, tuple[str, ...]] = {"tierlink": ("kserve",),
                                           "tierlink-json": ("mlserver",)}

# The batching part: one model where compute dominates, batched up to MAX_BATCH.
BATCH_MODEL, BATCH_SHAPE = "imagenet-mobilenetv2", ("input", (1, 3, 224, 224))
MAX_BATCH = 8
MLSERVER_BATCH_TIME_S = 0.001  # MLServer's adaptive batching: how long a batch may fill
BATCH_LANES = (Lane("tierlink-grpc", "tierlink", True, grpc=True),
               Lane("tierlink-batched-grpc", "tierlink-batched", True, grpc=True),
               Lane("mlserver-grpc", "mlserver-batched", True, grpc=True))
BATCH_GAIN_FLOOR = 0.9  # batched / unbatched >= 0.9 x ort_batch_gain
BATCH_RPS_FLOOR = 0.95  # against MLServer's adaptive batching
BATCH_CONCURRENCIES = ("8", "32")


@dataclass(frozen=True, slots=True)
class Cell:
    """One lane at one concurrency for one round."""

    p50_ms: float
    p99_ms: float
    rps: float
    cpu_ms_per_request: float
    client_cpu_ms_per_request: float
    other_cores: float  # CPU the rest of the machine used meanwhile, in cores: the noise
    requests: int
    errors: int


METRICS = ("p50_ms", "p99_ms", "rps", "cpu_ms_per_request", "client_cpu_ms_per_request",
           "other_cores")


@dataclass(frozen=True, slots=True)
class ModelChoice:
    name: str
    onnx: Path
    card: Path
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # --shape overrides
    threads: int = 1  # every server's intra-op threads (the thread budget), and the reference's


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    config: dict[str, Any]
    grpc_port: int | None = None


# -- pure parts: percentiles, /proc accounting, summaries, the verdict ------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    ppid: int
    ticks: int  # utime + stime + cutime + cstime: its threads and its reaped children


def parse_stat(text: str) -> ProcStat:
    """One ``/proc/PID/stat`` line. The command name may hold spaces and parentheses, so the
    fields are counted from its last ``)``."""
    pid = int(text.split(" (", 1)[0])
    rest = text[text.rindex(")") + 2:].split()  # rest[0] is field 3 (state)
    utime, stime, cutime, cstime = (int(v) for v in rest[11:15])
    return ProcStat(pid, int(rest[1]), utime + stime + cutime + cstime)


def tree_ticks(stats: Mapping[int, ProcStat], root: int) -> int:
    """CPU ticks of ``root`` and every live descendant. A child that exits and is reaped moves
    its time into its parent's ``cutime``/``cstime``, so the sum never drops."""
    children: dict[int, list[int]] = {}
    for st in stats.values():
        children.setdefault(st.ppid, []).append(st.pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid].ticks
            todo.extend(children.get(pid, ()))
    return total


def read_stats(proc_dir: Path = Path("/proc")) -> dict[int, ProcStat]:
    stats: dict[int, ProcStat] = {}
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            st = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        stats[st.pid] = st
    return stats


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of process ``root``'s tree so far."""
    return tree_ticks(read_stats(), root) / CLK_TCK


def machine_busy_s(stat_text: str) -> float:
    """CPU seconds all cores spent busy since boot, from ``/proc/stat``'s ``cpu`` line
    (user nice system idle iowait irq softirq steal; guest time is inside user)."""
    fields = [int(v) for v in stat_text.split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / CLK_TCK


def _machine_busy_s() -> float:
    return machine_busy_s(Path("/proc/stat").read_text())


def summarize(cells: Sequence[Cell]) -> dict[str, Any]:
    """Median over rounds of each metric, its min and max, and every round's figures."""
    out: dict[str, Any] = {}
    for m in METRICS:
        values = [getattr(c, m) for c in cells]
        out[m] = round(statistics.median(values), 4)
        out[f"{m}_min"] = round(min(values), 4)
        out[f"{m}_max"] = round(max(values), 4)
    out["requests"] = sum(c.requests for c in cells)
    out["errors"] = sum(c.errors for c in cells)
    out["rounds"] = [asdict(c) for c in cells]
    return out


def spread(summary: Mapping[str, Any], metric: str) -> float:
    """(max - min) / median of one metric over rounds."""
    mid = summary[metric]
    return (summary[f"{metric}_max"] - summary[f"{metric}_min"]) / mid if mid else 0.0


def verdict(servers: Mapping[str, Mapping[str, Mapping[str, Any]]],
            comparisons: Mapping[str, Sequence[str]] = COMPARISONS,
            rps_floor: float = RPS_FLOOR, p99_ceiling: float = P99_CEILING) -> dict[str, Any]:
    """Does each tierlink lane keep the bound against the best of its peers, per concurrency?
    The best peer throughput and the best (lowest) peer p99 are taken separately."""
    checks: dict[str, Any] = {}
    for ours, peers in comparisons.items():
        for conc, mine in servers[ours].items():
            best_rps = max(servers[p][conc]["rps"] for p in peers)
            best_p99 = min(servers[p][conc]["p99_ms"] for p in peers)
            rps_ratio = mine["rps"] / best_rps
            p99_ratio = mine["p99_ms"] / best_p99
            checks.setdefault(ours, {})[conc] = {
                "peers": list(peers), "rps_ratio": round(rps_ratio, 3),
                "p99_ratio": round(p99_ratio, 3), "rps_ok": rps_ratio >= rps_floor,
                "p99_ok": p99_ratio <= p99_ceiling,
                "holds": rps_ratio >= rps_floor and p99_ratio <= p99_ceiling}
    holds = all(c["holds"] for lane in checks.values() for c in lane.values())
    return {"bound": f"rps >= {rps_floor}x best peer and p99 <= {p99_ceiling}x best peer "
                     "p99, per concurrency, same wire format",
            "holds": holds, "checks": checks}


def batching_verdict(servers: Mapping[str, Mapping[str, Mapping[str, Any]]],
                     ort_batch_gain: float,
                     concurrencies: Sequence[str] = BATCH_CONCURRENCIES) -> dict[str, Any]:
    """Does batching win what ONNX Runtime allows, and keep up with MLServer's adaptive
    batching, at each of ``concurrencies``?"""
    checks: dict[str, Any] = {}
    for conc in (c for c in concurrencies if c in servers["tierlink-grpc"]):
        batched = servers["tierlink-batched-grpc"][conc]
        alone = servers["tierlink-grpc"][conc]
        peer = servers["mlserver-grpc"][conc]
        gain = batched["rps"] / alone["rps"]
        rps_ratio, p99_ratio = batched["rps"] / peer["rps"], batched["p99_ms"] / peer["p99_ms"]
        checks[conc] = {
            "batched_over_unbatched": round(gain, 3),
            "of_ort_batch_gain": round(gain / ort_batch_gain, 3),
            "gain_ok": gain >= BATCH_GAIN_FLOOR * ort_batch_gain,
            "rps_ratio_vs_mlserver": round(rps_ratio, 3),
            "p99_ratio_vs_mlserver": round(p99_ratio, 3),
            "rps_ok": rps_ratio >= BATCH_RPS_FLOOR, "p99_ok": p99_ratio <= P99_CEILING}
        checks[conc]["holds"] = all(checks[conc][k] for k in ("gain_ok", "rps_ok", "p99_ok"))
    return {"bound": f"at {' and '.join(concurrencies)} clients: batched/unbatched rps >= "
                     f"{BATCH_GAIN_FLOOR}x ort_batch_gain; against MLServer's adaptive "
                     f"batching over gRPC rps >= {BATCH_RPS_FLOOR}x and p99 <= "
                     f"{P99_CEILING}x its p99",
            "holds": bool(checks) and all(c["holds"] for c in checks.values()),
            "checks": checks}


def schedule(lanes: Sequence[str], concurrencies: Sequence[int],
             rounds: int) -> Iterator[tuple[int, int, str]]:
    """(round, concurrency, lane) in run order: every lane at every concurrency each round,
    the lane order rotated by one each round so no lane always runs first or last."""
    for r in range(rounds):
        order = list(lanes[r % len(lanes):]) + list(lanes[:r % len(lanes)])
        for conc in concurrencies:
            for lane in order:
                yield r, conc, lane


# -- the model ---------------------------------------------------------------------------------

_NP_OF_ORT = {"tensor(float)": np.float32, "tensor(double)": np.float64,
              "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
              "tensor(bool)": np.bool_}


def open_reference(model: ModelChoice) -> Any:
    """The model in this process, opened as every server opens it: the reference answers."""
    sys.path.insert(0, str(PEERS_DIR))
    from ort_session import open_session

    return open_session(str(model.onnx), model.threads)


def ort_batch_gain(session: Any, inputs: Mapping[str, np.ndarray], batch: int = MAX_BATCH,
                   rounds: int = 5, images: int = 96) -> dict[str, Any]:
    """ONNX Runtime's own gain from batching, in this process with the servers' session
    options: images/s at ``batch`` over batch 1, alternating, the median of ``rounds``."""
    many = {name: np.repeat(arr, batch, axis=0) for name, arr in inputs.items()}
    for feed in (dict(inputs), many):
        session.run(None, feed)  # warm
    ratios, alone, together = [], [], []
    for _ in range(rounds):
        alone.append(_images_per_s(session, dict(inputs), 1, images))
        together.append(_images_per_s(session, many, batch, images))
        ratios.append(together[-1] / alone[-1])
    return {"gain": round(statistics.median(ratios), 4), "batch": batch,
            "images_per_s_batch1": round(statistics.median(alone), 1),
            f"images_per_s_batch{batch}": round(statistics.median(together), 1),
            "rounds": [round(r, 4) for r in ratios]}


def _images_per_s(session: Any, feed: dict[str, np.ndarray], batch: int, images: int) -> float:
    runs = max(1, images // batch)
    start = time.perf_counter()
    for _ in range(runs):
        session.run(None, feed)
    return runs * batch / (time.perf_counter() - start)


def make_inputs(session: Any, shapes: Mapping[str, tuple[int, ...]],
                seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the model's signature: dynamic dimensions 1 (batch 1) unless
    ``shapes`` names the input."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        shape = shapes.get(arg.name) or tuple(d if isinstance(d, int) else 1 for d in arg.shape)
        dtype = _NP_OF_ORT.get(arg.type)
        if dtype is None:
            raise SystemExit(f"input {arg.name!r} has type {arg.type}: not supported here")
        if np.issubdtype(dtype, np.floating):
            out[arg.name] = rng.random(shape).astype(dtype)
        else:
            out[arg.name] = rng.integers(0, 2, size=shape).astype(dtype)
    return out


# -- the peers' virtualenvs --------------------------------------------------------------------


def pins_for(server: str) -> tuple[str, ...]:
    shared = tuple(f"{p}=={metadata.version(p)}" for p in SHARED_PINS)
    return PEER_PINS[server] + shared


def installed(python: Path, packages: Sequence[str]) -> dict[str, str | None]:
    code = ("import json, sys, importlib.metadata as m\n"
            "def v(p):\n    try:\n        return m.version(p)\n"
            "    except m.PackageNotFoundError:\n        return None\n"
            "print(json.dumps({p: v(p) for p in sys.argv[1:]}))")
    done = subprocess.run([str(python), "-c", code, *packages], capture_output=True,
                          text=True, check=True)
    return dict(json.loads(done.stdout))


def ensure_venv(server: str, root: Path = VENVS) -> Path:
    """The peer's virtualenv with its pins installed (made or repaired on first use)."""
    venv = root / f"{server}-venv"
    python = venv / "bin" / "python"
    pins = pins_for(server)
    wanted = dict(p.split("==") for p in pins)
    if python.exists() and installed(python, list(wanted)) == wanted:
        return venv
    if not python.exists():
        print(f"[{server}] making {venv}", file=sys.stderr, flush=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    print(f"[{server}] pip install {' '.join(pins)} (minutes, once)", file=sys.stderr,
          flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    return venv


# -- the servers -------------------------------------------------------------------------------


def _spawn(name: str, argv: list[str], workdir: Path, env: Mapping[str, str] | None,
           port: int, config: dict[str, Any]) -> Server:
    log = workdir / f"{name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=workdir, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env) if env else None,
                                start_new_session=True)
    print(f"[{name}] pid {proc.pid} on port {port}", file=sys.stderr, flush=True)
    return Server(name, proc, port, log, config)


def start_tierlink(model: ModelChoice, workdir: Path, port: int, name: str = "tierlink",
                   max_batch: int = 1, grpc_port: int | None = None) -> Server:
    from tierlink.core.types import Tier
    from tierlink.node.spec import ModelSource, NodeSpec
    from tierlink.settings.batching import BatchSettings

    batching = {model.name: BatchSettings(max_batch)} if max_batch > 1 else {}
    spec = NodeSpec(node_id="peers-bench", tier=Tier.parse("cloud"),
                    models=(ModelSource(model.name, str(model.onnx), str(model.card)),),
                    port=port, ready_file=str(workdir / f"{name}.ready"), batching=batching,
                    threads=model.threads, grpc_port=grpc_port)
    path = workdir / f"{name}-spec.json"
    path.write_text(spec.to_json())
    config = {"command": "tierlink node --spec SPEC.json", "processes": 1,
              "scheduler_workers": spec.workers, "intra_op_threads": model.threads,
              "batching": {m: b.to_dict() for m, b in batching.items()} or None,
              "grpc": grpc_port is not None,
              "http": "uvicorn (httptools, uvloop), no access log", "control_plane": None}
    server = _spawn(name, [str(ROOT / ".venv" / "bin" / "tierlink"), "node", "--spec",
                           str(path)], workdir, None, port, config)
    server.grpc_port = grpc_port
    return server


def start_mlserver(model: ModelChoice, workdir: Path, venv: Path, ports: Sequence[int],
                   name: str = "mlserver", max_batch: int = 1) -> Server:
    root = workdir / name
    (root / model.name).mkdir(parents=True)
    settings = {"debug": False, "parallel_workers": 0, "host": "127.0.0.1",
                "http_port": ports[0], "grpc_port": ports[1], "metrics_port": ports[2]}
    (root / "settings.json").write_text(json.dumps(settings, indent=2))
    model_settings: dict[str, Any] = {
        "name": model.name, "implementation": "mlserver_onnx.OnnxRuntime",
        "parameters": {"uri": str(model.onnx), "extra": {"threads": model.threads}}}
    if max_batch > 1:  # MLServer's adaptive batching
        model_settings |= {"max_batch_size": max_batch,
                           "max_batch_time": MLSERVER_BATCH_TIME_S}
    (root / model.name / "model-settings.json").write_text(json.dumps(model_settings,
                                                                      indent=2))
    config = {"command": "mlserver start DIR", "processes": 1, "settings": settings,
              "model_settings": model_settings, "intra_op_threads": model.threads,
              "wire": ("gRPC, binary tensors (raw_input_contents)" if max_batch > 1 else
                       "JSON tensors (no binary tensors over REST)"),
              "http": "uvicorn (httptools, uvloop), access log off (debug: false); "
                      "gRPC and metrics servers on (cannot be turned off, idle)"}
    env = {**os.environ, "PYTHONPATH": str(PEERS_DIR)}
    server = _spawn(name, [str(venv / "bin" / "mlserver"), "start", str(root)], workdir,
                    env, ports[0], config)
    server.grpc_port = ports[1]
    return server


def start_kserve(model: ModelChoice, workdir: Path, venv: Path, port: int) -> Server:
    argv = [str(venv / "bin" / "python"), str(PEERS_DIR / "kserve_onnx.py"),
            "--model_name", model.name, "--onnx", str(model.onnx), "--threads", str(model.threads),
            "--http_port", str(port), "--workers", "1", "--enable_grpc", "false",
            "--enable_latency_logging", "false"]
    config = {"command": "python peers/kserve_onnx.py " + shlex.join(argv[2:]), "processes": 1,
              "workers": 1, "grpc": False, "intra_op_threads": model.threads,
              "http": "uvicorn (httptools, uvloop) bound to 0.0.0.0 by KServe, driven on "
                      "127.0.0.1; access and timing logs lowered to WARNING"}
    env = {**os.environ, "PYTHONPATH": str(PEERS_DIR)}
    return _spawn("kserve", argv, workdir, env, port, config)


def wait_ready(server: Server, model: str, deadline_s: float = READY_TIMEOUT_S) -> None:
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    client = th.InferenceServerClient(f"127.0.0.1:{server.port}")
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            if server.proc.poll() is not None:
                raise SystemExit(f"{server.name} exited ({server.proc.returncode}):\n"
                                 f"{_tail(server.log)}")
            try:
                if client.is_model_ready(model):
                    return
            except (InferenceServerException, OSError):
                time.sleep(0.25)  # not listening yet
                continue
            time.sleep(0.25)
    finally:
        client.close()
    raise SystemExit(f"{server.name} not ready after {deadline_s:.0f} s:\n{_tail(server.log)}")


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop(server: Server) -> None:
    """SIGTERM the server, SIGKILL it after 10 s; then any descendant left, by pid."""
    stats = read_stats()
    family = [p for p in stats if p != server.proc.pid and _descends(stats, p, server.proc.pid)]
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _descends(stats: Mapping[int, ProcStat], pid: int, root: int) -> bool:
    seen = set()
    while pid in stats and pid not in seen:
        seen.add(pid)
        pid = stats[pid].ppid
        if pid == root:
            return True
    return False


# -- the load ----------------------------------------------------------------------------------


def request_parts(inputs: Mapping[str, np.ndarray], outputs: Sequence[str],
                  binary: bool) -> tuple[list[Any], list[Any]]:
    import tritonclient.http as th
    from tritonclient.utils import np_to_triton_dtype

    infer_inputs = []
    for name, arr in inputs.items():
        item = th.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        item.set_data_from_numpy(arr, binary_data=binary)
        infer_inputs.append(item)
    return infer_inputs, [th.InferRequestedOutput(n, binary_data=binary) for n in outputs]


def check_answers(port: int, model: str, inputs: Mapping[str, np.ndarray],
                  reference: Mapping[str, np.ndarray], binary: bool) -> None:
    """The server returns every output, equal to this process's run of the same model."""
    import tritonclient.http as th

    client = th.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        parts = request_parts(inputs, list(reference), binary)
        result = client.infer(model, parts[0], outputs=parts[1])
    finally:
        client.close()
    _same(port, reference, result.as_numpy)


def check_answers_grpc(port: int, model: str, inputs: Mapping[str, np.ndarray],
                       reference: Mapping[str, np.ndarray]) -> None:
    """As :func:`check_answers`, over gRPC."""
    import tritonclient.grpc as tg
    from tritonclient.utils import np_to_triton_dtype

    client = tg.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        parts = []
        for name, arr in inputs.items():
            item = tg.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
            item.set_data_from_numpy(arr)
            parts.append(item)
        result = client.infer(model, parts,
                              outputs=[tg.InferRequestedOutput(n) for n in reference])
    finally:
        client.close()
    _same(port, reference, result.as_numpy)


def _same(port: int, reference: Mapping[str, np.ndarray],
          got_of: Callable[[str], np.ndarray | None]) -> None:
    for name, want in reference.items():
        got = got_of(name)
        if got is None or not np.allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5):
            raise SystemExit(f"port {port}: output {name!r} differs from the reference run")


def drive(port: int, model: str, parts: tuple[list[Any], list[Any]], concurrency: int,
          warmup_s: float, duration_s: float, server_pid: int) -> Cell:
    """``concurrency`` closed-loop clients for ``warmup_s`` then ``duration_s`` measured."""
    import tritonclient.http as th

    client = th.InferenceServerClient(f"127.0.0.1:{port}", concurrency=concurrency,
                                      connection_timeout=30.0, network_timeout=30.0)
    try:
        return _cell(port, server_pid, warmup_s, duration_s, lambda seconds, lat, err:
                     _run_clients(client, model, parts, concurrency, seconds, lat, err))
    finally:
        client.close()


def drive_grpc(port: int, model: str, inputs: Mapping[str, np.ndarray],
               outputs: Sequence[str], concurrency: int, warmup_s: float, duration_s: float,
               server_pid: int) -> Cell:
    """As :func:`drive`, over the Open Inference Protocol's gRPC API (``tritonclient.grpc``'s
    asyncio client, binary tensors): ``concurrency`` closed-loop coroutines."""
    import asyncio

    def run_for(seconds: float, latencies: list[float], errors: list[int]) -> None:
        asyncio.run(_grpc_clients(port, model, inputs, outputs, concurrency, seconds,
                                  latencies, errors))

    return _cell(port, server_pid, warmup_s, duration_s, run_for)


async def _grpc_clients(port: int, model: str, inputs: Mapping[str, np.ndarray],
                        outputs: Sequence[str], concurrency: int, seconds: float,
                        latencies: list[float], errors: list[int]) -> None:
    import asyncio

    import tritonclient.grpc.aio as ga
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    client = ga.InferenceServerClient(f"127.0.0.1:{port}")
    parts = []
    for name, arr in inputs.items():
        item = ga.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        item.set_data_from_numpy(arr)
        parts.append(item)
    wanted = [ga.InferRequestedOutput(n) for n in outputs]
    end = time.perf_counter() + seconds

    async def one_client() -> None:
        while time.perf_counter() < end:
            start = time.perf_counter()
            try:
                await client.infer(model, parts, outputs=wanted, client_timeout=30.0)
            except InferenceServerException:  # counted, not fatal
                errors[0] += 1
                await asyncio.sleep(0.01)
                continue
            latencies.append((time.perf_counter() - start) * 1000.0)

    try:
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    finally:
        await client.close()


def _cell(port: int, server_pid: int, warmup_s: float, duration_s: float,
          run_for: Callable[[float, list[float], list[int]], None]) -> Cell:
    """A warm-up, then ``duration_s`` measured: latencies, throughput and who spent CPU."""
    run_for(warmup_s, [], [0])
    latencies: list[float] = []
    errors = [0]
    cpu0, own0, all0 = tree_cpu_s(server_pid), _own_cpu_s(), _machine_busy_s()
    t0 = time.perf_counter()
    run_for(duration_s, latencies, errors)
    wall = time.perf_counter() - t0
    busy = _machine_busy_s() - all0
    cpu, own = tree_cpu_s(server_pid) - cpu0, _own_cpu_s() - own0
    if not latencies:
        raise SystemExit(f"port {port}: no request succeeded ({errors[0]} errors)")
    n = len(latencies)
    return Cell(p50_ms=round(percentile(latencies, 50), 4),
                p99_ms=round(percentile(latencies, 99), 4), rps=round(n / wall, 2),
                cpu_ms_per_request=round(cpu * 1000.0 / n, 4),
                client_cpu_ms_per_request=round(own * 1000.0 / n, 4),
                other_cores=round(max(busy - cpu - own, 0.0) / wall, 3), requests=n,
                errors=errors[0])


def _run_clients(client: Any, model: str, parts: tuple[list[Any], list[Any]],
                 concurrency: int, seconds: float, latencies: list[float],
                 errors: list[int]) -> None:
    from http.client import HTTPException

    import gevent
    from tritonclient.utils import InferenceServerException

    end = time.perf_counter() + seconds

    def one_client() -> None:
        while time.perf_counter() < end:
            start = time.perf_counter()
            try:
                client.infer(model, parts[0], outputs=parts[1])
            except (InferenceServerException, HTTPException, OSError):  # counted, not fatal
                errors[0] += 1
                gevent.sleep(0.01)
                continue
            latencies.append((time.perf_counter() - start) * 1000.0)

    gevent.joinall([gevent.spawn(one_client) for _ in range(concurrency)])


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


# -- the run -----------------------------------------------------------------------------------


def start_servers(stack: ExitStack, model: ModelChoice, workdir: Path,
                  venvs: Mapping[str, Path]) -> dict[str, Server]:
    from tierlink.netports import pick_port

    return _ready(stack, model, {
        "tierlink": start_tierlink(model, workdir, pick_port()),
        "mlserver": start_mlserver(model, workdir, venvs["mlserver"],
                                   [pick_port(), pick_port(), pick_port()]),
        "kserve": start_kserve(model, workdir, venvs["kserve"], pick_port()),
    })


def start_batching_servers(stack: ExitStack, model: ModelChoice, workdir: Path,
                           venvs: Mapping[str, Path]) -> dict[str, Server]:
    from tierlink.netports import pick_port

    return _ready(stack, model, {
        "tierlink": start_tierlink(model, workdir, pick_port(), grpc_port=pick_port()),
        "tierlink-batched": start_tierlink(model, workdir, pick_port(), "tierlink-batched",
                                           MAX_BATCH, grpc_port=pick_port()),
        "mlserver-batched": start_mlserver(model, workdir, venvs["mlserver"],
                                           [pick_port(), pick_port(), pick_port()],
                                           "mlserver-batched", MAX_BATCH),
    })


def _ready(stack: ExitStack, model: ModelChoice,
           servers: dict[str, Server]) -> dict[str, Server]:
    for server in servers.values():
        stack.callback(stop, server)
    for server in servers.values():
        wait_ready(server, model.name)
        print(f"[{server.name}] ready", file=sys.stderr, flush=True)
    return servers


def measure(args: argparse.Namespace, model: ModelChoice,
            servers: Mapping[str, Server], inputs: dict[str, np.ndarray],
            reference: dict[str, np.ndarray],
            lanes_run: Sequence[Lane] = LANES) -> dict[str, dict[str, list[Cell]]]:
    lanes = {lane.name: lane for lane in lanes_run}
    parts = {name: request_parts(inputs, list(reference), lane.binary)
             for name, lane in lanes.items() if not lane.grpc}
    for lane in lanes_run:
        server = servers[lane.server]
        if lane.grpc:
            assert server.grpc_port is not None
            check_answers_grpc(server.grpc_port, model.name, inputs, reference)
        else:
            check_answers(server.port, model.name, inputs, reference, lane.binary)
    cells: dict[str, dict[str, list[Cell]]] = {n: {} for n in lanes}
    plan = list(schedule(list(lanes), args.concurrency, args.rounds))
    for i, (r, conc, name) in enumerate(plan):
        lane, server = lanes[name], servers[lanes[name].server]
        if lane.grpc:
            assert server.grpc_port is not None
            cell = drive_grpc(server.grpc_port, model.name, inputs, list(reference), conc,
                              args.warmup, args.duration, server.proc.pid)
        else:
            cell = drive(server.port, model.name, parts[name], conc, args.warmup,
                         args.duration, server.proc.pid)
        cells[name].setdefault(str(conc), []).append(cell)
        print(f"[{i + 1}/{len(plan)}] round {r + 1} c={conc:<3} {name:16} p50 "
              f"{cell.p50_ms:7.2f} ms  p99 {cell.p99_ms:7.2f} ms  {cell.rps:8.1f} rps  "
              f"cpu {cell.cpu_ms_per_request:6.3f} ms/req  other {cell.other_cores:4.2f} cores  "
              f"errors {cell.errors}",
              file=sys.stderr, flush=True)
    return cells


def environment(venvs: Mapping[str, Path]) -> dict[str, Any]:
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         check=False, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
                           check=False, capture_output=True, text=True).stdout.strip()
    ours = ("onnxruntime", "numpy", "tritonclient", "uvicorn", "uvloop", "httptools",
            "fastapi", "starlette", "gevent", "geventhttpclient")
    peers = {name: installed(venv / "bin" / "python",
                             [*(p.split("==")[0] for p in pins_for(name)), "uvicorn", "uvloop",
                              "fastapi", "starlette"])
             for name, venv in venvs.items()}
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "cpu_model": _cpu_model(),
            "loadavg_at_start": os.getloadavg(),
            "tierlink_rev": rev + (" + uncommitted changes under src/" if dirty else ""),
            "project_venv": {p: _version(p) for p in ours}, "peer_venvs": peers}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(args: argparse.Namespace) -> dict[str, Any]:
    venvs = {name: ensure_venv(name) for name in PEER_PINS}
    env = environment(venvs)
    result: dict[str, Any] = {}
    if args.part in ("all", "peers"):
        model = _model(args.model_name, args.onnx, args.card, dict(args.shape), args.threads)
        result |= run_peers(args, model, venvs)
    if args.part in ("all", "batching"):
        model = _model(BATCH_MODEL, None, None, dict([BATCH_SHAPE]), args.threads)
        result["batching"] = run_batching(args, model, venvs)
    env["loadavg_at_end"] = os.getloadavg()
    return result | {"environment": env,
                     "command": shlex.join([os.path.relpath(sys.executable, ROOT), *sys.argv])}


def _model(name: str, onnx: Path | None, card: Path | None,
           shapes: dict[str, tuple[int, ...]], threads: int) -> ModelChoice:
    if onnx is None or card is None:  # the model named, as the catalog finds it
        from tierlink.models.catalog import Catalog, SourceOptions

        found = Catalog.default(SourceOptions(progress=False)).resolve([name])[name]
        onnx, card = onnx or found.file, card or found.card
    model = ModelChoice(name, onnx, card, shapes, threads)
    for path in (model.onnx, model.card):
        if not path.exists():
            raise SystemExit(f"{path} does not exist (the zoo's models: tierlink zoo build)")
    return model


def run_peers(args: argparse.Namespace, model: ModelChoice,
              venvs: Mapping[str, Path]) -> dict[str, Any]:
    """tierlink against MLServer and KServe on ``model``, each on its own wire format."""
    session = open_reference(model)
    inputs = make_inputs(session, model.shapes)
    reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    _announce(len(LANES), args)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierlink-peers-")))
        servers = start_servers(stack, model, workdir, venvs)
        cells = measure(args, model, servers, inputs, reference)
        configs = {name: s.config for name, s in servers.items()}
    summary = {lane: {conc: summarize(c) for conc, c in per.items()}
               for lane, per in cells.items()}
    return {"servers": summary, "verdict": verdict(summary), "server_configs": configs,
            "lanes": [asdict(lane) for lane in LANES], "comparisons": COMPARISONS,
            "settings": _settings(args, model, inputs)}


def run_batching(args: argparse.Namespace, model: ModelChoice,
                 venvs: Mapping[str, Path]) -> dict[str, Any]:
    """Batching on and off on one node each, and MLServer's adaptive batching, judged
    against what ONNX Runtime itself gains from a batch (measured first, on a quiet
    machine)."""
    session = open_reference(model)
    inputs = make_inputs(session, model.shapes)
    reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    gain = ort_batch_gain(session, inputs)
    print(f"ONNX Runtime: batch {MAX_BATCH} / batch 1 = {gain['gain']:.3f}x images/s",
          file=sys.stderr, flush=True)
    del session
    _announce(len(BATCH_LANES), args)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierlink-peers-")))
        servers = start_batching_servers(stack, model, workdir, venvs)
        cells = measure(args, model, servers, inputs, reference, BATCH_LANES)
        configs = {name: s.config for name, s in servers.items()}
    summary = {lane: {conc: summarize(c) for conc, c in per.items()}
               for lane, per in cells.items()}
    return {"servers": summary, "ort_batch_gain": gain["gain"], "ort": gain,
            "verdict": batching_verdict(summary, gain["gain"]), "server_configs": configs,
            "lanes": [asdict(lane) for lane in BATCH_LANES], "max_batch": MAX_BATCH,
            "settings": _settings(args, model, inputs)}


def _announce(lanes: int, args: argparse.Namespace) -> None:
    cells = lanes * len(args.concurrency) * args.rounds
    print(f"{cells} cells of {args.warmup + args.duration:.0f} s: about "
          f"{cells * (args.warmup + args.duration) / 60:.1f} min", file=sys.stderr)


def _settings(args: argparse.Namespace, model: ModelChoice,
              inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    return {"model": model.name, "onnx": str(model.onnx), "card": str(model.card),
            "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)}
                       for k, v in inputs.items()},
            "batch": 1, "concurrency": args.concurrency, "rounds": args.rounds,
            "warmup_s": args.warmup, "duration_s": args.duration,
            "client": "tritonclient.http (geventhttpclient), one client per cell, "
                      "closed-loop greenlets, this process",
            "session_options": f"intra_op {model.threads}, inter_op 1, no spinning, "
                               "CPUExecutionProvider",
            "order": "each round: concurrencies in turn, every lane at each, lane order "
                     "rotated by one per round"}


# -- output ------------------------------------------------------------------------------------


def print_table(result: Mapping[str, Any], out: Callable[[str], None] = print) -> None:
    if "servers" in result:
        _lanes_table(result["servers"], out)
        v = result["verdict"]
        out(f"verdict ({v['bound']}): {'HOLDS' if v['holds'] else 'MISSED'}")
        for ours, per in v["checks"].items():
            for conc, c in per.items():
                out(f"  {ours:14} c={conc:<3} vs {'/'.join(c['peers'])}: rps "
                    f"x{c['rps_ratio']:.2f} {'ok' if c['rps_ok'] else 'MISS'}, p99 "
                    f"x{c['p99_ratio']:.2f} {'ok' if c['p99_ok'] else 'MISS'}")
    if "batching" in result:
        part = result["batching"]
        out(f"batching, {part['settings']['model']}: ONNX Runtime's batch "
            f"{part['max_batch']} / batch 1 = {part['ort_batch_gain']:.3f}x")
        _lanes_table(part["servers"], out)
        v = part["verdict"]
        out(f"verdict ({v['bound']}): {'HOLDS' if v['holds'] else 'MISSED'}")
        for conc, c in v["checks"].items():
            out(f"  c={conc:<3} batched/unbatched x{c['batched_over_unbatched']:.3f} "
                f"({c['of_ort_batch_gain']:.2f} of ONNX Runtime's) "
                f"{'ok' if c['gain_ok'] else 'MISS'}; vs MLServer rps "
                f"x{c['rps_ratio_vs_mlserver']:.2f} {'ok' if c['rps_ok'] else 'MISS'}, p99 "
                f"x{c['p99_ratio_vs_mlserver']:.2f} {'ok' if c['p99_ok'] else 'MISS'}")


def _lanes_table(servers: Mapping[str, Any], out: Callable[[str], None]) -> None:
    out(f"{'lane':17}{'c':>4}{'p50 ms':>9}{'p99 ms':>9}{'rps':>9}{'cpu ms/req':>12}"
        f"{'rps spread':>12}{'p99 spread':>12}{'other cores':>13}")
    for lane, per in servers.items():
        for conc, s in per.items():
            out(f"{lane:17}{conc:>4}{s['p50_ms']:9.2f}{s['p99_ms']:9.2f}{s['rps']:9.1f}"
                f"{s['cpu_ms_per_request']:12.3f}{spread(s, 'rps'):11.0%} "
                f"{spread(s, 'p99_ms'):11.0%} {s['other_cores']:12.2f}")


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.partition("=")
    try:
        return name, tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape wants INPUT=d0,d1,..., got {text!r}") \
            from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--part", choices=("all", "peers", "batching"), default="all",
                        help="peers: tierlink against MLServer and KServe on --model-name; "
                             f"batching: batching on and off on {BATCH_MODEL}")
    parser.add_argument("--model-name", default="fmnist-large")
    parser.add_argument("--onnx", type=Path, default=None,
                        help="the model's file (default: --model-name's, from the catalog)")
    parser.add_argument("--card", type=Path, default=None,
                        help="its card (default: --model-name's, from the catalog)")
    parser.add_argument("--shape", type=_shape, action="append", default=[],
                        help="INPUT=d0,d1,... for an input with dynamic dimensions "
                             "(default: each dynamic dimension 1)")
    parser.add_argument("--concurrency", default=[1, 8, 32],
                        type=lambda s: [int(c) for c in s.split(",")])
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of every server's session (the thread budget)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=6.0, help="measured s per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up s per cell")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    result = run(args)
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
