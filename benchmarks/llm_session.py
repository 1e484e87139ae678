"""A conversation that moves: the next turn's first-token time with the KV cache shipped
ahead of it, against the upstream prefilling the whole history.

A cloud node serves SmolLM2-135M-Instruct (FP32); four device nodes serve the same weights
file, each behind its own emulated link to the cloud (``--rtt-ms`` round trip,
``--mbit`` each way: the chat fleet's 20 ms / 50 Mbit/s). Each device holds its
conversations' caches with ``kv_move: never`` (the baseline: the cloud prefills the
history), or ``always`` with the ``fp32``, ``fp16`` or ``int8`` codec. Per conversation
length (``--lengths``, prompt tokens of the first turn): the first turn is answered on the
device (``mode: local``, its cache kept), the second turn is placed on the cloud
(``mode: remote``) and streamed; reported per codec:

* ``ttft_ms``: the second turn's time to first token at the client (median of
  ``--repeats``), and ``ratio`` = moved / prefill;
* ``bytes`` on the wire, ``move_ms`` (pack, ship, load) as the device measured it;
* ``identical``: the answer equals the conversation continued on the device unmoved (token
  for token); where not, ``first_divergent_token``;
* ``crossover_mbit``: the link bandwidth above which moving beats prefilling, from this
  run's figures: the move's fixed part (its time less the bytes at ``--mbit``) against the
  prefill's first-token time (None: moving never wins).

    .venv/bin/python benchmarks/llm_session.py [--json PATH] [--lengths 250,1000,4000]
        [--repeats 1] [--rtt-ms 20] [--mbit 50]

Every process shares this machine's two cores: a device's pack and the cloud's load
compete with nothing else here, as they would on their own machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from tierlink.llm.prompts import QUESTIONS

CODECS = ("never", "fp32", "fp16", "int8", "int4")
FOLLOW_UP = "Answer the first question in one sentence."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--lengths", default="250,1000,4000")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--rtt-ms", type=float, default=20.0)
    p.add_argument("--mbit", type=float, default=50.0)
    p.add_argument("--max-tokens", type=int, default=16)
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in str(args.lengths).split(",")]
    return args


def _spawn_links(stack: ExitStack, run_dir: Path, cloud_port: int, rtt_ms: float,
                 mbit: float) -> dict[str, Any]:
    import subprocess

    from tierlink.netem.server import read_ready_file
    from tierlink.testing.processes import stop

    specs = [{"name": f"dev-{c}->cloud-1", "target_host": "127.0.0.1",
              "target_port": cloud_port, "delay_ms": rtt_ms / 2, "bandwidth_mbit": mbit}
             for c in CODECS]
    (run_dir / "links.json").write_text(json.dumps(specs))
    ready = run_dir / "links.ready"
    log = open(run_dir / "links.log", "wb")  # noqa: SIM115 - closed by the stack
    stack.callback(log.close)
    proc = subprocess.Popen([sys.executable, "-m", "tierlink.netem.server", "--spec",
                             str(run_dir / "links.json"), "--control-port", "0",
                             "--ready-file", str(ready)], stdout=log, stderr=subprocess.STDOUT)
    stack.callback(stop, proc)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the link emulator did not start: "
                             + (run_dir / "links.log").read_text()[-2000:])
        time.sleep(0.1)
    return dict(read_ready_file(ready).link_ports)


def start_fleet(stack: ExitStack, run_dir: Path, rtt_ms: float, mbit: float
                ) -> dict[str, str]:
    from tierlink.core.types import Tier
    from tierlink.llm.source import LMSource
    from tierlink.node.spec import NodeSpec, UpstreamSpec
    from tierlink.testing.processes import node_process

    def spec(node_id: str, tier: str, **kw: Any) -> NodeSpec:
        return NodeSpec(node_id=node_id, tier=Tier.parse(tier), models=(), port=0,
                        ready_file=str(run_dir / f"{node_id}.ready"),
                        chat_tasks={"chat": "smollm2"}, **kw)
    cloud, _ = stack.enter_context(node_process(spec(
        "cloud-1", "cloud", llms=(LMSource("smollm2", "smollm2-135m", max_sessions=64),)),
        run_dir))
    ports = _spawn_links(stack, run_dir, int(cloud.rsplit(":", 1)[1]), rtt_ms, mbit)
    urls = {"cloud": cloud}
    for codec in CODECS:
        via = f"http://127.0.0.1:{ports[f'dev-{codec}->cloud-1']}"
        move = "never" if codec == "never" else "always"
        url, _ = stack.enter_context(node_process(spec(
            f"dev-{codec}", "device", upstreams=(UpstreamSpec("cloud-1", via),),
            llms=(LMSource("smollm2", "smollm2-135m", kv_move=move,
                           kv_codec="fp16" if codec == "never" else codec),)), run_dir))
        urls[codec] = url
    return urls


def first_turn(tokens: int, codec: Any) -> list[dict[str, str]]:
    """A first user message whose chat prompt is about ``tokens`` tokens: numbered
    questions, as many as fit."""
    lines: list[str] = []
    i = 0
    while True:
        line = f"{i + 1}. {QUESTIONS[i % len(QUESTIONS)]}"
        trial = [{"role": "user", "content": "\n".join([*lines, line])}]
        if len(codec.encode(codec.chat_prompt(trial))) > tokens and lines:
            return [{"role": "user", "content": "\n".join(lines)}]
        lines.append(line)
        i += 1


def turn(http: httpx.Client, url: str, messages: list[dict[str, str]], session: str,
         mode: str, max_tokens: int) -> dict[str, Any]:
    """One streamed turn. A remote turn refused because the device's view lacks the cloud
    (its models list did not answer within the peer timeout while every core was busy
    prefilling) is asked again, up to five times, and the retries are counted."""
    for attempt in range(5):
        try:
            done = _turn(http, url, messages, session, mode, max_tokens)
        except _NotPlaced:
            time.sleep(1.0)
            continue
        done["retries"] = attempt
        return done
    raise SystemExit(f"{url}: the {mode} turn was refused five times")


class _NotPlaced(Exception):
    pass


def _turn(http: httpx.Client, url: str, messages: list[dict[str, str]], session: str,
          mode: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": "chat", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "tierlink": {"session": session, "mode": mode, "deadline_ms": 600_000}}
    from tierlink.client.chat_stream import ChatStream

    stream = ChatStream()
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code == 400 and b"not possible here" in r.read():
            raise _NotPlaced
        if r.status_code != 200:
            raise SystemExit(f"{url}: HTTP {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            stream.feed(line)
    return {"text": stream.text, "ttft_ms": (stream.ttft_s or 0.0) * 1e3,
            "usage": stream.usage, "meta": stream.tierlink}


def conversation(http: httpx.Client, urls: dict[str, str], codec: str, length: int,
                 first: list[dict[str, str]], tag: str, max_tokens: int) -> dict[str, Any]:
    """One conversation on ``codec``'s device: its first turn there, its second moved."""
    session = f"{tag}-{codec}-{length}"
    answer = turn(http, urls[codec], first, session, "local", max_tokens)
    second = [*first, {"role": "assistant", "content": answer["text"]},
              {"role": "user", "content": FOLLOW_UP}]
    moved = turn(http, urls[codec], second, session, "remote", max_tokens)
    moved["messages"] = second
    return moved


def unmoved(http: httpx.Client, url: str, first: list[dict[str, str]], length: int,
            max_tokens: int) -> str:
    """The same conversation's second answer, continued on the device that holds it."""
    session = f"stay-{length}"
    answer = turn(http, url, first, session, "local", max_tokens)
    second = [*first, {"role": "assistant", "content": answer["text"]},
              {"role": "user", "content": FOLLOW_UP}]
    return str(turn(http, url, second, session, "local", max_tokens)["text"])


def divergence(a: str, b: str, codec: Any) -> int | None:
    """The index of the first token where two answers differ (None: identical)."""
    ta, tb = codec.encode(a), codec.encode(b)
    for i, (x, y) in enumerate(zip(ta, tb, strict=False)):
        if x != y:
            return i
    return None if len(ta) == len(tb) else min(len(ta), len(tb))


def crossover(bytes_: int, moved_ms: float, prefill_ms: float, mbit: float) -> float | None:
    fixed_ms = moved_ms - bytes_ * 8 / (mbit * 1e6) * 1e3
    if prefill_ms <= fixed_ms:
        return None
    return round(bytes_ * 8 / ((prefill_ms - fixed_ms) / 1e3) / 1e6, 1)


def run_length(http: httpx.Client, urls: dict[str, str], length: int, args: argparse.Namespace,
               codec_text: Any) -> list[dict[str, Any]]:
    first = first_turn(length, codec_text)
    reference = unmoved(http, urls["never"], first, length, args.max_tokens)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CODECS}
    for rep in range(args.repeats):
        for codec in CODECS:
            runs[codec].append(conversation(http, urls, codec, length, first, f"r{rep}",
                                            args.max_tokens))
    prefill_ms = statistics.median(r["ttft_ms"] for r in runs["never"])
    rows = []
    for codec in CODECS:
        done = runs[codec]
        kv = done[0]["meta"].get("kv") or {}
        ttft = statistics.median(r["ttft_ms"] for r in done)
        text = done[0]["text"]
        first_div = divergence(text, reference, codec_text)
        row: dict[str, Any] = {
            "tokens": int(done[0]["usage"].get("prompt_tokens", 0)), "length": length,
            "codec": "prefill" if codec == "never" else codec,
            "ttft_ms": round(ttft, 1), "ttft_runs_ms": [round(r["ttft_ms"], 1) for r in done],
            "ratio": round(ttft / prefill_ms, 3),
            "cached_tokens": int((done[0]["usage"].get("prompt_tokens_details") or {})
                                 .get("cached_tokens", 0)),
            "moved": bool(kv.get("moved")), "bytes": int(kv.get("bytes", 0)),
            "move_ms": kv.get("ms"), "identical": first_div is None,
            "retries": sum(r["retries"] for r in done),
            "first_divergent_token": first_div}
        if codec != "never":
            row["crossover_mbit"] = crossover(row["bytes"], ttft, prefill_ms, args.mbit)
        rows.append(row)
        print(f"{length:>5}  {row['codec']:<8} ttft {row['ttft_ms']:>8.1f} ms  "
              f"x{row['ratio']:<6} cached {row['cached_tokens']:>5}  "
              f"{row['bytes'] / 1e6:>7.2f} MB  identical {row['identical']}  "
              f"crossover {row.get('crossover_mbit')} Mbit/s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from tierlink.llm.text import TextCodec
    from tierlink.llm.weights import install_model

    args = parse_args(argv)
    codec_text = TextCodec(install_model("smollm2-135m"))
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="tierlink-session-") as tmp:
        urls = start_fleet(stack, Path(tmp), args.rtt_ms, args.mbit)
        with httpx.Client(timeout=900) as http:
            for length in args.lengths:
                rows.extend(run_length(http, urls, length, args, codec_text))
    result = {"benchmark": "llm_session", "rtt_ms": args.rtt_ms, "mbit": args.mbit,
              "repeats": args.repeats, "rows": rows, "bound": _bound(rows)}
    print(json.dumps(result["bound"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _bound(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Moved ≤ 0.7× the prefill at 1,000 tokens (the best codec), and the FP32 move
    identical to the unmoved answer."""
    at = [r for r in rows if r["length"] == 1000 and r["codec"] != "prefill"]
    best = min(at, key=lambda r: r["ratio"]) if at else None
    exact = [r for r in rows if r["codec"] == "fp32"]
    return {"best_at_1000": best and {"codec": best["codec"], "ratio": best["ratio"]},
            "met_0_7": bool(best and best["ratio"] <= 0.7),
            "fp32_identical": all(r["identical"] for r in exact) if exact else None}


if __name__ == "__main__":
    main()
