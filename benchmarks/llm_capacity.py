"""Speculation measured as capacity: how many chat clients one verifier core serves, each
at least ``--floor`` tokens/s, per mode.

The cloud node (SmolLM2-135M-Instruct FP32) is pinned to core 0 — the verifier core; what
the cloud itself spends on a mode runs there too. Per mode, N clients generate at once,
each ``--requests`` greedy answers of ``--max-tokens`` tokens (``ignore_eos``: every answer
is that long), streamed; N grows from 1 until a client falls below the floor. A client's
tokens/s is its tokens over the time from its first token to its last, summed over its
answers (what it sees once an answer has begun); the capacity is the last N at which every
client kept the floor. Modes:

* ``cloud_only`` — the clients call the cloud over their links; the cloud decodes their
  sequences in one continuous batch;
* ``cloud_speculative`` — the cloud drafts for itself: a drafting node per client (the
  INT8 copy) pinned to the cloud's core, verified by the cloud over loopback (no link);
* ``speculative`` — each client's device drafts (INT8, its own node) and the cloud verifies
  over the device's link, one round after another;
* ``speculative_overlap`` — the same, the device drafting the next round while the current
  one is verified (``draft_ahead``);
* ``speculative_replayed``, ``speculative_overlap_replayed`` — the two device modes with
  replayed devices (``llm_replay.py``): the same proposals and rounds, the drafting time
  slept as on a device with a core of its own.

Devices, the link emulator and the clients share core 1: on this two-core machine the
devices' drafting is bounded by one core for all of them, which a fleet of real devices is
not — it counts against the device modes. Greedy output is compared with cloud-only's for
the same prompt; the first divergent character is reported where they differ.

Each cell also says how busy each core was: where the devices' core, not the verifier's,
runs out first, ``projected_clients_per_verifier_core`` — the clients' tokens/s over the
share of the verifier's core they used, divided by the floor — is what the verifier's core
alone would allow (an upper bound: it assumes the core's work grows no faster than its
clients).

    .venv/bin/python benchmarks/llm_capacity.py [--json PATH] [--rtt-ms 20] [--max-clients 8]
        [--requests 2] [--max-tokens 48] [--floor 8] [--modes ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from tierlink.client.chat_stream import ChatStream
from tierlink.llm.prompts import QUESTIONS

MODES = ("cloud_only", "cloud_speculative", "speculative", "speculative_overlap",
         "speculative_replayed", "speculative_overlap_replayed")
REPLAY_PROMPTS = 8  # replayed clients cycle through the first eight prompts
PROMPTS = QUESTIONS[:16]
VERIFIER_CORE, OTHER_CORE = 0, 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--rtt-ms", type=float, default=20.0)
    p.add_argument("--max-clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=2, help="answers per client per cell")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--floor", type=float, default=8.0, help="tokens/s every client must get")
    p.add_argument("--modes", default=",".join(MODES))
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = set(args.modes) - set(MODES)
    if unknown:
        p.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    return args


# -- the fleet ----------------------------------------------------------------------------


def pin(pid: int, core: int) -> None:
    """Pin ``pid`` and its threads to ``core`` (a node's torch and server threads)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), {core})


def pin_children(core: int, skip: set[int]) -> None:
    """Pin this process's children (but ``skip``) to ``core``."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines()
                          if ":\t" in line)
        except OSError:
            continue
        pid = int(status.parent.name)
        if int(fields.get("PPid", "0").strip()) == os.getpid() and pid not in skip:
            pin(pid, core)


def start_fleet(stack: ExitStack, run_dir: Path, clients: int, rtt_ms: float,
                modes: list[str]) -> dict[str, Any]:
    from llm import start_links, start_node
    from tierlink.core.types import Tier
    from tierlink.llm.source import LMSource
    from tierlink.node.spec import NodeSpec, UpstreamSpec

    def spec(node_id: str, tier: str, **kw: Any) -> NodeSpec:
        return NodeSpec(node_id=node_id, tier=Tier.parse(tier), models=(), port=0,
                        ready_file=str(run_dir / f"{node_id}.ready"),
                        chat_tasks={"chat": "smollm2"}, **kw)

    drafter = (LMSource("smollm2", "smollm2-135m", quantize="int8",
                        verifier="cloud-1/smollm2"),)

    cloud, cloud_proc = start_node(stack, run_dir, spec(
        "cloud-1", "cloud", llms=(LMSource("smollm2", "smollm2-135m", max_sequences=32,
                                           max_sessions=128),)))
    pin(cloud_proc.pid, VERIFIER_CORE)
    control, links = start_links(stack, run_dir, int(cloud.rsplit(":", 1)[1]), clients)
    pin_children(OTHER_CORE, {cloud_proc.pid})  # the link emulator
    for name in links:
        httpx.put(f"{control}/links/{name}", json={"delay_ms": rtt_ms / 2})
    fleet: dict[str, Any] = {"cloud": cloud, "cloud_pid": cloud_proc.pid, "devices": [],
                             "co_drafters": []}
    device_modes = {"speculative", "speculative_overlap"}
    for i in range(1, clients + 1):
        via = f"http://127.0.0.1:{links[f'dev-{i}->cloud-1']['listen_port']}"
        url = None
        if device_modes & set(modes):
            url, proc = start_node(stack, run_dir, spec(
                f"dev-{i}", "device", upstreams=(UpstreamSpec("cloud-1", via),),
                llms=drafter))
            pin(proc.pid, OTHER_CORE)
        fleet["devices"].append({"url": url, "via": via,
                                 "pid": proc.pid if url is not None else None})
        if "cloud_speculative" in modes:
            co, proc = start_node(stack, run_dir, spec(
                f"cdr-{i}", "cloud", upstreams=(UpstreamSpec("cloud-1", cloud),),
                llms=drafter))
            pin(proc.pid, VERIFIER_CORE)  # the cloud drafting for itself
            fleet["co_drafters"].append(co)
            fleet.setdefault("co_pids", []).append(proc.pid)
    return fleet


# -- one cell -----------------------------------------------------------------------------


def _target(fleet: dict[str, Any], mode: str, i: int) -> tuple[str, dict[str, Any] | None]:
    """Where client ``i`` sends its requests in ``mode``, and the body's ``tierlink``."""
    if mode == "cloud_only":
        return fleet["devices"][i]["via"], None
    if mode == "cloud_speculative":
        return fleet["co_drafters"][i], {"mode": "speculative", "draft_ahead": False}
    return fleet["devices"][i]["url"], {"mode": "speculative",
                                        "draft_ahead": mode == "speculative_overlap"}


async def answer(http: httpx.AsyncClient, url: str, prompt: str, tierlink: dict | None,
                 max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "chat", "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True, "stream": True,
                            "messages": [{"role": "user", "content": prompt}],
                            "stream_options": {"include_usage": True}}
    if tierlink is not None:
        body["tierlink"] = tierlink
    stream = ChatStream()
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            stream.feed(line)
    return {"prompt": prompt, "text": stream.text, "meta": stream.tierlink,
            "ttft_s": stream.ttft_s or 0.0, "stream_s": stream.stream_s,
            "tokens": stream.completion_tokens}


def run_cell(fleet: dict[str, Any], mode: str, n: int, args: argparse.Namespace
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from llm_replay import replay

    from llm import passes

    replayed = mode.endswith("_replayed")
    pool = REPLAY_PROMPTS if replayed else len(PROMPTS)
    prompts = [[PROMPTS[(i * args.requests + r) % pool] for r in range(args.requests)]
               for i in range(n)]

    async def client(http: httpx.AsyncClient, i: int) -> list[dict[str, Any]]:
        if replayed:
            url = fleet["devices"][i]["via"] + "/tierlink/v1/llm/smollm2/verify"
            ahead = mode == "speculative_overlap_replayed"
            return [await replay(http, url, fleet["scripts"][p], f"replay-{i}-{j}",
                                 fleet["draft_s"], ahead) for j, p in enumerate(prompts[i])]
        url, tierlink = _target(fleet, mode, i)
        return [await answer(http, url, p, tierlink, args.max_tokens) for p in prompts[i]]

    async def run() -> list[list[dict[str, Any]]]:
        async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
            return list(await asyncio.gather(*[client(http, i) for i in range(n)]))

    core0 = [fleet["cloud_pid"], *fleet.get("co_pids", [])]
    devices = [d["pid"] for d in fleet["devices"] if d["pid"] is not None]
    cpu0, wall0, passes0 = _cpu(core0), time.perf_counter(), passes(fleet["cloud"])
    dev0 = _cpu(devices)
    per_client = asyncio.run(run())
    wall = time.perf_counter() - wall0
    busy = {"verifier_core": round((_cpu(core0) - cpu0) / wall, 3),
            "devices": round((_cpu(devices) - dev0) / wall, 3)}
    cloud_passes = passes(fleet["cloud"]) - passes0
    # a client's rate once its answers have begun: tokens after the first, over stream time
    rates = [sum(a["tokens"] - 1 for a in c) / max(sum(a["stream_s"] for a in c), 1e-9)
             for c in per_client]
    answers = [a for c in per_client for a in c]
    ttfts = sorted(a["ttft_s"] * 1e3 for a in answers)
    metas = [a.get("meta") or a for a in answers]  # a replayed answer is its own record
    drafted = sum(m.get("drafted", 0) for m in metas)
    row = {"mode": mode, "clients": n, "tokens_per_s_min": round(min(rates), 2),
           "tokens_per_s": round(statistics.mean(rates), 2),
           "ttft_p50_ms": round(statistics.median(ttfts), 1),
           "kept_floor": min(rates) >= args.floor, "busy_cores": busy,
           # what the verifier's core would serve busy all the time: the clients' tokens/s
           # over the share of the core the cell used
           "tokens_per_verifier_core_s": round(sum(rates) / max(busy["verifier_core"], 1e-3),
                                               2),
           "verifier_passes_per_token": round(cloud_passes / max(
               sum(a["tokens"] for a in answers), 1), 3)}
    if drafted:
        rounds = sum(m.get("rounds", 0) for m in metas)
        row |= {"acceptance": round(sum(m.get("accepted", 0) for m in metas) / drafted, 3),
                "mean_k": round(drafted / max(rounds, 1), 2),
                "ahead_hits": round(sum(m.get("ahead_hits", 0) for m in metas)
                                    / max(rounds, 1), 3),
                "degraded": sum(bool(m.get("degraded")) for m in metas)}
    return row, answers


def _cpu(pids: list[int]) -> float:
    from llm import cpu_s

    return sum(cpu_s(pid) for pid in pids)


def first_divergence(a: str, b: str) -> int | None:
    """The first character at which two answers differ (None: identical)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


# -- the run ------------------------------------------------------------------------------


def sweep(fleet: dict[str, Any], mode: str, args: argparse.Namespace,
          reference: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Cells of ``mode`` for 1, 2, ... clients until one falls below the floor; the
    capacity row and every cell's."""
    cells, best, diverged, compared = [], None, [], 0
    for n in range(1, args.max_clients + 1):
        row, answers = run_cell(fleet, mode, n, args)
        cells.append(row)
        print(f"  {mode:<28} {n} clients  min {row['tokens_per_s_min']:>6.2f} tok/s  "
              f"mean {row['tokens_per_s']:>6.2f}  ttft p50 {row['ttft_p50_ms']:>7.1f} ms"
              + f"  busy {row['busy_cores']}  passes/token {row['verifier_passes_per_token']}"
              + (f"  acc {row['acceptance']:.2f} k {row['mean_k']:.1f} "
                 f"ahead {row['ahead_hits']:.2f}" if "acceptance" in row else ""), flush=True)
        for a in answers:
            if a.get("diverged_at") is not None:
                diverged.append({"prompt": a["prompt"], "first_divergent_token":
                                 a["diverged_at"]})
            if "text" not in a:  # replayed: checked token by token against the target
                compared += 1
                continue
            if mode == "cloud_only":
                reference.setdefault(a["prompt"], a["text"])
            elif a["prompt"] in reference:
                compared += 1
                at = first_divergence(a["text"], reference[a["prompt"]])
                if at is not None:
                    diverged.append({"prompt": a["prompt"], "first_divergent_char": at})
        if not row["kept_floor"]:
            break
        best = row
    capacity = {"rtt_ms": args.rtt_ms, "mode": mode,
                "clients_per_verifier_core": best["clients"] if best else 0,
                # at most this many at the floor, were the verifier's core the only limit
                "projected_clients_per_verifier_core": round(max(
                    c["tokens_per_verifier_core_s"] for c in cells) / args.floor, 2),
                "tokens_per_s": best["tokens_per_s"] if best else None,
                "tokens_per_s_min": best["tokens_per_s_min"] if best else None,
                "ttft_p50_ms": best["ttft_p50_ms"] if best else None,
                "compared": compared, "diverged": diverged}
    return capacity, cells


def capacity(args: argparse.Namespace) -> dict[str, Any]:
    rows, cells = [], []
    reference: dict[str, str] = {}
    modes = sorted(args.modes, key=MODES.index)  # cloud-only first: the reference answers
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="tierlink-cap-") as tmp:
        replays = {}
        if any(m.endswith("_replayed") for m in modes):
            from llm_replay import scripts

            print("replay: the target's answers and the draft's chains ...", flush=True)
            made, draft_s = scripts(list(PROMPTS[:REPLAY_PROMPTS]), args.max_tokens)
            replays = {"scripts": {s.prompt: s for s in made}, "draft_s": draft_s}
            print(f"replay: the draft takes {draft_s * 1e3:.1f} ms a token", flush=True)
        fleet = start_fleet(stack, Path(tmp), args.max_clients, args.rtt_ms, modes)
        fleet |= replays
        os.sched_setaffinity(0, {OTHER_CORE})
        for mode in modes:
            row, mode_cells = sweep(fleet, mode, args, reference)
            rows.append(row)
            cells.extend(mode_cells)
    by_mode = {r["mode"]: r["clients_per_verifier_core"] for r in rows}
    projected = {r["mode"]: r["projected_clients_per_verifier_core"] for r in rows}
    ratio = projected_ratio = None
    if by_mode.get("cloud_speculative") and "speculative_overlap" in by_mode:
        ratio = round(by_mode["speculative_overlap"] / by_mode["cloud_speculative"], 2)
        projected_ratio = round(projected["speculative_overlap"]
                                / projected["cloud_speculative"], 2)
    replayed_ratio = None
    if by_mode.get("cloud_speculative") and "speculative_overlap_replayed" in by_mode:
        replayed_ratio = round(by_mode["speculative_overlap_replayed"]
                               / by_mode["cloud_speculative"], 2)
    return {"capacity": rows, "capacity_cells": cells,
            "overlap_vs_cloud_speculative": ratio,
            "overlap_vs_cloud_speculative_projected": projected_ratio,
            "overlap_replayed_vs_cloud_speculative": replayed_ratio,
            "replay_draft_ms_per_token": round(fleet.get("draft_s", 0.0) * 1e3, 2) or None,
            "capacity_settings": {"rtt_ms": args.rtt_ms, "floor_tokens_per_s": args.floor,
                                  "requests": args.requests, "max_tokens": args.max_tokens,
                                  "max_clients": args.max_clients,
                                  "verifier_core": VERIFIER_CORE, "cores": os.cpu_count()}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("capacity needs two cores: one for the verifier, one for the rest")
    result = capacity(args)
    print(f"{'mode':<28} {'clients/verifier core':>22} {'projected':>10} {'tok/s':>7} "
          f"{'ttft p50 ms':>12}")
    for r in result["capacity"]:
        print(f"{r['mode']:<28} {r['clients_per_verifier_core']:>22} "
              f"{r['projected_clients_per_verifier_core']:>10.2f} "
              f"{r['tokens_per_s'] or 0:>7.2f} {r['ttft_p50_ms'] or 0:>12.1f}"
              + (f"  diverged: {r['diverged']}" if r["diverged"] else ""))
    print(f"speculative_overlap / cloud_speculative: {result['overlap_vs_cloud_speculative']}"
          f" (projected {result['overlap_vs_cloud_speculative_projected']}; replayed devices "
          f"{result['overlap_replayed_vs_cloud_speculative']})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
