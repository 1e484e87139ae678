"""A bounded KV cache on a device: one conversation of 2,000 generated tokens at flat memory.

Starts a device node serving SmolLM2's INT8 copy with a KV cap (``--cap-kib``; sliding window
plus 4 attention sinks) and holds one conversation with it (``tierlink.session``): turn after
turn, a new question appended to the whole history (as an OpenAI client sends it), greedy
answers of up to ``--turn-tokens`` tokens, until ``--tokens`` tokens were generated. The node
process's RSS is sampled after every turn: reported when the window first fills and its
range after (bound: within 10%), beside the same conversation without a cap. Each answer's
share of distinct words says whether the text stays sensible once the window slides.

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

from tierlink.llm.prompts import QUESTIONS as EVERYDAY

QUESTIONS = EVERYDAY[:16]  # the turns of the one conversation, in this order


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(cap_bytes: int | None, tokens: int, turn_tokens: int, run_dir: Path) -> dict[str, Any]:
    from tierlink.core.types import Tier
    from tierlink.llm.source import LMSource
    from tierlink.llm.weights import model_dir, read_config
    from tierlink.node.spec import NodeSpec
    from tierlink.testing.processes import node_process

    name = "dev-cap" if cap_bytes else "dev-nocap"
    spec = NodeSpec(node_id=name, tier=Tier.DEVICE, models=(), port=0,
                    ready_file=str(run_dir / f"{name}.ready"),
                    llms=(LMSource("smollm2", "smollm2-135m", quantize="int8",
                                   kv_cache_bytes=cap_bytes),))
    per_token = read_config(model_dir("smollm2-135m")).kv_bytes_per_token
    window = cap_bytes // per_token if cap_bytes else None
    turns: list[dict[str, Any]] = []
    messages: list[dict[str, str]] = []
    generated = 0
    start = time.perf_counter()
    with node_process(spec, run_dir) as (url, proc), httpx.Client(timeout=600) as http:
        while generated < tokens:
            messages.append({"role": "user", "content": QUESTIONS[len(turns) % len(QUESTIONS)]})
            body = {"model": "smollm2", "messages": messages, "temperature": 0,
                    "max_tokens": min(turn_tokens, tokens - generated),
                    "tierlink": {"session": "conversation-1"}}
            r = http.post(url + "/v1/chat/completions", json=body)
            r.raise_for_status()
            answer = r.json()
            text = answer["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": text})
            usage = answer["usage"]
            generated += usage["completion_tokens"]
            words = text.split()
            turns.append({"turn": len(turns) + 1, "generated": generated,
                          "prompt_tokens": usage["prompt_tokens"],
                          "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                          "rss_mib": round(rss_mib(proc.pid), 1),
                          "distinct_words": round(len(set(words)) / max(1, len(words)), 3),
                          "question": messages[-2]["content"], "answer": text[:160]})
    seconds = time.perf_counter() - start
    filled = [t for t in turns if window is None or t["prompt_tokens"] >= window]
    after = [t["rss_mib"] for t in filled] or [turns[-1]["rss_mib"]]
    return {"cap_bytes": cap_bytes, "window_tokens": window, "generated": generated,
            "turns": len(turns), "seconds": round(seconds, 1),
            "final_prompt_tokens": turns[-1]["prompt_tokens"],
            "rss_mib_at_fill": after[0], "rss_mib_min_after": min(after),
            "rss_mib_max_after": max(after),
            "rss_growth_after_fill": round(max(after) / after[0] - 1, 4),
            "mean_distinct_words": round(sum(t["distinct_words"] for t in turns)
                                         / len(turns), 3),
            "per_turn": turns}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--cap-kib", type=int, default=12288)
    p.add_argument("--turn-tokens", type=int, default=120)
    p.add_argument("--no-baseline", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tierlink-kv-") as tmp:
        capped = run(args.cap_kib * 1024, args.tokens, args.turn_tokens, Path(tmp))
        base = None if args.no_baseline else run(None, args.tokens, args.turn_tokens,
                                                 Path(tmp))
    ok = capped["rss_growth_after_fill"] is not None and capped["rss_growth_after_fill"] <= 0.10
    for r in filter(None, (capped, base)):
        print(f"cap {r['cap_bytes']!s:>10}  window {r['window_tokens']!s:>5}  "
              f"{r['generated']} tokens in {r['turns']} turns, {r['seconds']} s; history "
              f"{r['final_prompt_tokens']} tokens; RSS at fill {r['rss_mib_at_fill']} MiB, "
              f"after {r['rss_mib_min_after']}-{r['rss_mib_max_after']} MiB (growth "
              f"{r['rss_growth_after_fill']:.1%}); distinct words {r['mean_distinct_words']}")
    print(f"flat within 10% after the window fills: {ok}")
    for t in capped["per_turn"][-3:]:
        print(f"  turn {t['turn']}: {t['question']!r} -> {t['answer'][:100]!r}")
    result = {"capped": capped, "uncapped": base, "flat_within_10pct": ok}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
