"""A language model split at a layer: per cut ``k`` and codec, the bytes a token sends up,
the first token's time over a link, and greedy agreement with the unsplit model.

SmolLM2-135M (30 layers, hidden 576, FP32) on one thread for each side; the device runs the
embedding and layers ``0..k-1`` and sends each position's hidden state (``llm/layer_split.py``,
codecs of ``split/codecs.py``), the upstream runs the rest with its own KV cache. The link is
priced, not emulated: ``--rtt-ms`` and ``--mbit`` (the chat fleet's 20 ms / 50 Mbit/s) plus
the payload's transfer time. Beside each cut: the whole model on the device, and the prompt's
token ids sent to the upstream (4 bytes a token) with the whole model there. Both sides run
on this machine's CPU: a real device is slower, which moves the best cut toward the device's
side being short.

    .venv/bin/python benchmarks/llm_split.py [--json PATH] [--cuts 2,8,15,22,28]
        [--codecs fp32,fp16,int8,int8c] [--prompts 6] [--tokens 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tierlink.llm.prompts import SHORT_PROMPTS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--cuts", default="2,8,15,22,28")
    p.add_argument("--codecs", default="fp32,fp16,int8,int8c")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--tokens", type=int, default=20)
    p.add_argument("--rtt-ms", type=float, default=20.0)
    p.add_argument("--mbit", type=float, default=50.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from tierlink.llm.layer_split import first_divergence, greedy, split_greedy
    from tierlink.llm.model import LlamaModel
    from tierlink.llm.text import TextCodec
    from tierlink.llm.weights import install_model

    args = parse_args(argv)
    torch.set_num_threads(1)
    directory = install_model("smollm2-135m")
    model, text = LlamaModel.load(directory), TextCodec(directory)
    prompts = [text.encode(text.chat_prompt([{"role": "user", "content": p}]))
               for p in SHORT_PROMPTS[:args.prompts]]
    link_s = args.rtt_ms / 1000.0

    def wire_s(nbytes: float) -> float:
        return link_s + nbytes * 8 / (args.mbit * 1e6)

    reference, whole_s = [], []
    for ids in prompts:
        began = time.perf_counter()
        reference.append(greedy(model, ids, args.tokens))
        whole_s.append(_first_token_s(model, ids))
        _progress(f"reference: {len(reference)}/{len(prompts)} prompts ({time.perf_counter() - began:.1f} s)")
    prompt_tokens = statistics.mean(len(p) for p in prompts)
    ttft_device = statistics.median(whole_s)
    rows: list[dict[str, Any]] = []
    for cut in (int(c) for c in args.cuts.split(",")):
        for codec in args.codecs.split(","):
            runs = [split_greedy(model, model, ids, cut, codec, args.tokens) for ids in prompts]
            rows.append(_row(cut, codec, runs, reference, wire_s, first_divergence))
            _progress(f"cut {cut} {codec}: agreement {rows[-1]['greedy_agreement']:.3f}, "
                      f"{rows[-1]['bytes_per_token']:.0f} B/token, first token "
                      f"{rows[-1]['ttft_ms']:.0f} ms")
    result = {
        "model": "smollm2-135m (fp32, 30 layers, hidden 576)", "threads_per_side": 1,
        "link": {"rtt_ms": args.rtt_ms, "mbit": args.mbit},
        "prompts": len(prompts), "prompt_tokens_mean": round(prompt_tokens, 1),
        "tokens": args.tokens,
        "whole_on_device": {"ttft_ms": round(1000 * ttft_device, 1)},
        "whole_upstream": {"ttft_ms": round(1000 * (ttft_device + wire_s(4 * prompt_tokens)), 1),
                           "bytes_per_token": 4},
        "rows": rows,
    }
    _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


def _first_token_s(model: Any, ids: list[int]) -> float:
    from tierlink.llm.kvcache import KVCache
    from tierlink.llm.model import Step

    began = time.perf_counter()
    model.forward([Step(KVCache(model.config), ids, block=True)])
    return time.perf_counter() - began


def _row(cut: int, codec: str, runs: list[Any], reference: list[list[int]], wire_s: Any,
         first_divergence: Any) -> dict[str, Any]:
    diverged = [first_divergence(ref, run.tokens) for ref, run in zip(reference, runs,
                                                                       strict=True)]
    agreed = [len(ref) if d is None else d for ref, d in zip(reference, diverged, strict=True)]
    ttft = [run.device_s[0] + wire_s(run.payload_bytes[0]) + run.upstream_s[0] for run in runs]
    decode_bytes = [b for run in runs for b in run.payload_bytes[1:]]
    return {"cut": cut, "codec": codec,
            "bytes_per_token": round(statistics.mean(decode_bytes), 1) if decode_bytes else None,
            "prompt_bytes_mean": round(statistics.mean(r.payload_bytes[0] for r in runs), 1),
            "ttft_ms": round(1000 * statistics.median(ttft), 1),
            "device_ms_first": round(1000 * statistics.median(r.device_s[0] for r in runs), 1),
            "upstream_ms_first": round(1000 * statistics.median(r.upstream_s[0] for r in runs),
                                       1),
            "greedy_agreement": round(sum(agreed) / sum(len(r) for r in reference), 4),
            "identical": all(d is None for d in diverged),
            "first_divergence": diverged}


def _print(r: dict[str, Any]) -> None:
    print(f"{r['prompts']} prompts of ~{r['prompt_tokens_mean']} tokens, {r['tokens']} tokens "
          f"each; link {r['link']['rtt_ms']} ms / {r['link']['mbit']} Mbit/s")
    print(f"whole model on the device: first token {r['whole_on_device']['ttft_ms']} ms; "
          f"token ids to the upstream: {r['whole_upstream']['ttft_ms']} ms")
    print(f"{'cut':>4} {'codec':<6} {'B/token':>8} {'first token ms':>15} {'agreement':>10} "
          "first divergence")
    for row in r["rows"]:
        print(f"{row['cut']:>4} {row['codec']:<6} {row['bytes_per_token']:>8} "
              f"{row['ttft_ms']:>15} {row['greedy_agreement']:>10.3f} {row['first_divergence']}")


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
