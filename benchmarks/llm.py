"""Chat across tiers on a real fleet: device-only, cloud-only and speculative decoding.

A cloud node serves SmolLM2-135M-Instruct (FP32, batch-invariant rows); N device nodes serve
its INT8 copy and draft for the cloud. Every device reaches the cloud through the user-space
link emulator at the given RTT. Per (RTT, devices, mode) the devices generate at once, each
``--requests`` greedy answers of up to ``--max-tokens`` tokens, streamed:

* ``device_only``: each device answers with its own INT8 model (``tierlink.mode=local``);
* ``cloud_only``: each device's application calls the cloud through its link (the cloud
  batches the devices' sequences continuously);
* ``speculative``: each device drafts k tokens, the cloud verifies them in one pass
  (batched across devices), k adapts to acceptance and round trip.

Reported per row: tokens/s per device, p50/p95 time to first token, the cloud's CPU-seconds
and forward passes per generated token, acceptance and mean k, and for speculative rows what
a round's time went to (draft, link, verify). ``identical_greedy``: every speculative answer
equals the cloud's own greedy answer to the same prompt, token for token.

    .venv/bin/python benchmarks/llm.py [--json PATH] [--rtts 5,20,50] [--devices 1,4,8]
        [--requests 2] [--max-tokens 48] [--quick] [--capacity [--no-grid]]

``--capacity`` adds ``capacity`` rows: clients per verifier core at 20 ms for cloud-only,
the cloud drafting for itself, devices drafting, and devices drafting ahead
(``benchmarks/llm_capacity.py``, which runs them alone too).

All processes share this machine's cores: devices here have no CPU of their own, so device
drafting competes with the cloud's verification — on a real fleet it would not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from tierlink.client.chat_stream import ChatStream
from tierlink.llm.prompts import QUESTIONS

ROOT = Path(__file__).resolve().parents[1]
MODES = ("device_only", "cloud_only", "speculative")
PROMPTS = QUESTIONS[:16]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--rtts", default="5,20,50")
    p.add_argument("--devices", default="1,4,8")
    p.add_argument("--requests", type=int, default=2, help="answers per device per cell")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--quick", action="store_true", help="RTT 20 ms, 1 and 4 devices")
    p.add_argument("--capacity", action="store_true",
                   help="add capacity rows (benchmarks/llm_capacity.py, at 20 ms)")
    p.add_argument("--no-grid", action="store_true", help="only the capacity rows")
    args = p.parse_args(argv)
    if args.quick:
        args.rtts, args.devices = "20", "1,4"
    args.rtts = [float(x) for x in str(args.rtts).split(",")]
    args.devices = [int(x) for x in str(args.devices).split(",")]
    return args


# -- processes ----------------------------------------------------------------------------


def _spawn(stack: ExitStack, run_dir: Path, name: str, args: list[str]) -> subprocess.Popen:
    from tierlink.testing.processes import stop

    log = open(run_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed by the stack
    stack.callback(log.close)
    proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT)
    stack.callback(stop, proc)
    return proc


def _wait_ready(path: Path, proc: subprocess.Popen, run_dir: Path, name: str) -> dict:
    deadline = time.monotonic() + 180
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            log = (run_dir / f"{name}.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"{name} did not start:\n{log}")
        time.sleep(0.1)
    return dict(json.loads(path.read_text()))


def start_node(stack: ExitStack, run_dir: Path, spec: Any) -> tuple[str, subprocess.Popen]:
    from tierlink.testing.processes import node_process

    return stack.enter_context(node_process(spec, run_dir))


def start_links(stack: ExitStack, run_dir: Path, cloud_port: int, n: int) -> tuple[str, dict]:
    specs = [{"name": f"dev-{i}->cloud-1", "target_host": "127.0.0.1",
              "target_port": cloud_port, "delay_ms": 10.0} for i in range(1, n + 1)]
    spec_file = run_dir / "links.json"
    spec_file.write_text(json.dumps(specs))
    ready_file = run_dir / "links.ready"
    proc = _spawn(stack, run_dir, "links", ["-m", "tierlink.netem.server", "--spec",
                                           str(spec_file), "--control-port", "0",
                                           "--ready-file", str(ready_file)])
    ready = _wait_ready(ready_file, proc, run_dir, "links")
    return ready["control_url"], ready["links"]


def start_fleet(stack: ExitStack, run_dir: Path, devices: int) -> dict[str, Any]:
    from tierlink.core.types import Tier
    from tierlink.llm.source import LMSource
    from tierlink.node.spec import NodeSpec, UpstreamSpec

    def spec(node_id: str, tier: str, **kw: Any) -> NodeSpec:
        return NodeSpec(node_id=node_id, tier=Tier.parse(tier), models=(), port=0,
                        ready_file=str(run_dir / f"{node_id}.ready"),
                        chat_tasks={"chat": "smollm2"}, **kw)
    cloud_url, cloud_proc = start_node(stack, run_dir, spec(
        "cloud-1", "cloud", llms=(LMSource("smollm2", "smollm2-135m", max_sequences=32,
                                           max_sessions=128),)))
    control, links = start_links(stack, run_dir, int(cloud_url.rsplit(":", 1)[1]), devices)
    nodes = {}
    for i in range(1, devices + 1):
        link = links[f"dev-{i}->cloud-1"]
        via = f"http://127.0.0.1:{link['listen_port']}"
        url, _ = start_node(stack, run_dir, spec(
            f"dev-{i}", "device", upstreams=(UpstreamSpec("cloud-1", via),),
            llms=(LMSource("smollm2", "smollm2-135m", quantize="int8",
                           verifier="cloud-1/smollm2"),)))
        nodes[f"dev-{i}"] = {"url": url, "via": via}
    return {"cloud": cloud_url, "cloud_pid": cloud_proc.pid, "control": control,
            "devices": nodes}


# -- one cell -----------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def passes(cloud: str) -> float:
    for line in httpx.get(cloud + "/metrics").text.splitlines():
        if line.startswith("tierlink_llm_forward_passes_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def one(http: httpx.AsyncClient, url: str, prompt: str, mode: str,
              max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "chat", "max_tokens": max_tokens, "temperature": 0,
                            "messages": [{"role": "user", "content": prompt}], "stream": True,
                            "stream_options": {"include_usage": True}}
    if mode != "cloud_only":
        body["tierlink"] = {"mode": "local" if mode == "device_only" else "speculative"}
    stream = ChatStream()
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            stream.feed(line)
    return {"prompt": prompt, "text": stream.text, "ttft_s": stream.ttft_s or 0.0,
            "wall_s": time.perf_counter() - stream.started,
            "tokens": stream.completion_tokens, "meta": stream.tierlink}


async def device_run(http: httpx.AsyncClient, url: str, prompts: list[str], mode: str,
                     max_tokens: int) -> list[dict[str, Any]]:
    return [await one(http, url, p, mode, max_tokens) for p in prompts]


def run_cell(fleet: dict[str, Any], mode: str, n: int, requests: int,
             max_tokens: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    devices = list(fleet["devices"].values())[:n]
    prompts = [[PROMPTS[(i * requests + r) % len(PROMPTS)] for r in range(requests)]
               for i in range(n)]
    cpu0, passes0 = cpu_s(fleet["cloud_pid"]), passes(fleet["cloud"])

    async def run() -> list[list[dict[str, Any]]]:
        async with httpx.AsyncClient(timeout=600) as http:
            return list(await asyncio.gather(*[
                device_run(http, d["via"] if mode == "cloud_only" else d["url"], ps, mode,
                           max_tokens) for d, ps in zip(devices, prompts, strict=True)]))
    per_device = asyncio.run(run())
    cloud_cpu, cloud_passes = cpu_s(fleet["cloud_pid"]) - cpu0, passes(fleet["cloud"]) - passes0
    answers = [a for dev in per_device for a in dev]
    tokens = sum(a["tokens"] for a in answers)
    rates = [sum(a["tokens"] for a in dev) / sum(a["wall_s"] for a in dev) for dev in per_device]
    ttfts = sorted(a["ttft_s"] * 1e3 for a in answers)
    row: dict[str, Any] = {
        "devices": n, "mode": mode, "tokens": tokens,
        "tokens_per_s": round(statistics.mean(rates), 2),
        "ttft_p50_ms": round(_pct(ttfts, 50), 1), "ttft_p95_ms": round(_pct(ttfts, 95), 1),
        "cloud_cpu_s_per_token": round(cloud_cpu / max(tokens, 1), 5),
        "cloud_passes_per_token": round(cloud_passes / max(tokens, 1), 4),
        "acceptance": None, "mean_k": None}
    if mode == "speculative":
        metas = [a["meta"] for a in answers]
        drafted = sum(m.get("drafted", 0) for m in metas)
        row["acceptance"] = round(sum(m.get("accepted", 0) for m in metas) / max(drafted, 1), 3)
        rounds = sum(m.get("rounds", 0) for m in metas)
        row["mean_k"] = round(drafted / max(rounds, 1), 2)
        row["degraded"] = sum(bool(m.get("degraded")) for m in metas)
        row["time_split_s"] = _split(metas)
    return row, answers


def _split(metas: list[dict[str, Any]]) -> dict[str, float]:
    draft = sum(m.get("timings_s", {}).get("draft", 0.0) for m in metas)
    trips = sum(m.get("timings_s", {}).get("round_trips", 0.0) for m in metas)
    server = sum(m.get("timings_s", {}).get("verifier_server", 0.0) for m in metas)
    return {"draft": round(draft, 3), "link": round(max(trips - server, 0.0), 3),
            "verify": round(server, 3)}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    idx = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[idx]


# -- the run ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    identical, compared = True, 0
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="tierlink-llm-") as tmp:
        run_dir = Path(tmp)
        fleet = start_fleet(stack, run_dir, max(args.devices)) if not args.no_grid else {}
        for rtt in args.rtts if not args.no_grid else ():
            for name in (f"dev-{i}->cloud-1" for i in range(1, max(args.devices) + 1)):
                httpx.put(f"{fleet['control']}/links/{name}", json={"delay_ms": rtt / 2})
            for n in args.devices:
                texts: dict[str, dict[str, str]] = {}
                for mode in MODES:
                    row, answers = run_cell(fleet, mode, n, args.requests, args.max_tokens)
                    row = {"rtt_ms": rtt, **row}
                    rows.append(row)
                    texts[mode] = {a["prompt"]: a["text"] for a in answers}
                    _print_row(row)
                for prompt, text in texts["speculative"].items():
                    compared += 1
                    identical &= text == texts["cloud_only"].get(prompt)
    _verdicts(rows)
    result = {"rows": rows, "identical_greedy": identical, "compared": compared,
              "settings": {"requests": args.requests, "max_tokens": args.max_tokens,
                           "model": "smollm2-135m", "draft": "int8", "cores": os.cpu_count()}}
    print(f"identical greedy output: {identical} ({compared} answers compared)")
    if args.capacity:  # a fleet of its own: the verifier pinned to one core
        import llm_capacity

        result |= llm_capacity.main([])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


def _print_row(r: dict[str, Any]) -> None:
    extra = ""
    if r["mode"] == "speculative":
        extra = f"  acc {r['acceptance']:.2f} k {r['mean_k']:.1f}  split {r['time_split_s']}"
    print(f"rtt {r['rtt_ms']:>4.0f}  dev {r['devices']}  {r['mode']:<12} "
          f"{r['tokens_per_s']:>6.1f} tok/s/dev  ttft p50 {r['ttft_p50_ms']:>7.1f} "
          f"p95 {r['ttft_p95_ms']:>7.1f} ms  cloud {r['cloud_cpu_s_per_token'] * 1e3:>6.1f} "
          f"ms CPU/token  {r['cloud_passes_per_token']:.3f} passes/token{extra}", flush=True)


def _verdicts(rows: list[dict[str, Any]]) -> None:
    """Per (rtt, devices): speculative vs cloud-only on the issue's two bounds."""
    for r in rows:
        if r["mode"] != "speculative":
            continue
        base = next(b for b in rows if b["mode"] == "cloud_only" and b["rtt_ms"] == r["rtt_ms"]
                    and b["devices"] == r["devices"])
        r["cpu_ratio"] = round(r["cloud_cpu_s_per_token"] / max(base["cloud_cpu_s_per_token"],
                                                                1e-9), 3)
        r["speedup"] = round(r["tokens_per_s"] / max(base["tokens_per_s"], 1e-9), 3)
        split = r.get("time_split_s", {})
        r["dominant_cost"] = max(split, key=split.get) if split else None


if __name__ == "__main__":
    main()
