"""A bounded KV cache on a device: one conversation of 2,000 generated tokens at flat memory.

Starts a device node serving SmolLM2's INT8 copy with a KV cap (``--cap-kib``; sliding window
plus 4 attention sinks), streams one completion of ``--tokens`` tokens (``ignore_eos``) and
samples the node process's RSS every 50 tokens. Reports RSS when the window first fills and
its range after (bound: within 10%), the same run without a cap for comparison, and the
tail of the text (does it stay sensible?).

    .venv/bin/python benchmarks/llm_kv.py [--json PATH] [--tokens 2000] [--cap-kib 12288]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

PROMPT = ("The following is a long, detailed travel diary of a journey along the coast, "
          "written day by day.\n\nDay 1.")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(cap_bytes: int | None, tokens: int, run_dir: Path) -> dict[str, Any]:
    from tierlink.core.types import Tier
    from tierlink.llm.source import LMSource
    from tierlink.llm.weights import LlamaConfig, model_dir, read_config
    from tierlink.node.spec import NodeSpec
    from tierlink.testing.processes import node_process

    name = "dev-cap" if cap_bytes else "dev-nocap"
    spec = NodeSpec(node_id=name, tier=Tier.DEVICE, models=(), port=0,
                    ready_file=str(run_dir / f"{name}.ready"),
                    llms=(LMSource("smollm2", "smollm2-135m", quantize="int8",
                                   kv_cache_bytes=cap_bytes),))
    cfg: LlamaConfig = read_config(model_dir("smollm2-135m"))
    window = cap_bytes // cfg.kv_bytes_per_token if cap_bytes else None
    samples: list[tuple[int, float]] = []
    text: list[str] = []
    with node_process(spec, run_dir) as (url, proc):
        body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": tokens,
                "temperature": 0.7, "top_p": 0.9, "seed": 1, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        count = 0
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=1200) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                for choice in data.get("choices", []):
                    if choice.get("text"):
                        text.append(choice["text"])
                        count += 1
                        if count % 50 == 0:
                            samples.append((count, rss_mib(proc.pid)))
                if data.get("usage"):
                    count = data["usage"]["completion_tokens"]
        seconds = time.perf_counter() - start
    prompt_tokens = 24
    filled = [(n, r) for n, r in samples if window is None or n + prompt_tokens >= window]
    after = [r for _, r in filled]
    out = "".join(text)
    words = out.split()
    return {"cap_bytes": cap_bytes, "window_tokens": window, "generated": count,
            "seconds": round(seconds, 1), "tokens_per_s": round(count / seconds, 1),
            "rss_mib_at_fill": round(after[0], 1) if after else None,
            "rss_mib_min_after": round(min(after), 1) if after else None,
            "rss_mib_max_after": round(max(after), 1) if after else None,
            "rss_growth_after_fill": round(max(after) / after[0] - 1, 4) if after else None,
            "distinct_word_share_last_200": round(len(set(words[-200:])) / max(1, len(words[-200:])), 3),
            "tail": out[-400:], "samples": samples}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--cap-kib", type=int, default=12288)
    p.add_argument("--no-baseline", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tierlink-kv-") as tmp:
        capped = run(args.cap_kib * 1024, args.tokens, Path(tmp))
        base = None if args.no_baseline else run(None, args.tokens, Path(tmp))
    ok = capped["rss_growth_after_fill"] is not None and capped["rss_growth_after_fill"] <= 0.10
    for r in filter(None, (capped, base)):
        print(f"cap {str(r['cap_bytes']):>10}  window {str(r['window_tokens']):>5}  "
              f"{r['generated']} tokens in {r['seconds']} s ({r['tokens_per_s']} tok/s)  RSS "
              f"at fill {r['rss_mib_at_fill']} MiB, after {r['rss_mib_min_after']}-"
              f"{r['rss_mib_max_after']} MiB (growth {r['rss_growth_after_fill']:.1%})")
    print(f"flat within 10% after the window fills: {ok}")
    print("tail of the capped conversation:", repr(capped["tail"][-200:]))
    result = {"capped": capped, "uncapped": base, "flat_within_10pct": ok}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
