"""Language-model runtimes side by side: the torch decoder (FP32, INT8) and llama.cpp on the
GGUF as it ships (Q4_1) — tokens/s and memory per runtime, and speculative decoding with
each runtime as draft or target: acceptance, tokens/s, and greedy output against the
target's own (the first divergent token wherever they differ).

SmolLM2-135M-Instruct on one thread. Memory: each runtime loaded alone in a fresh process
(resident bytes after loading, weights bytes). Speed: prefill of a ~300-token prompt and
decoding through the runtime's own ``generate`` (its engine; a new prompt each run, so no
cached prefix is reused). Speculation
in process (the verifier called directly, no link), greedy, the same prompts for every pair.

    .venv/bin/python benchmarks/llm_runtimes.py [--json PATH] [--prompts 8] [--tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tierlink.llm.prompts import SHORT_PROMPTS

RUNTIMES = ("torch-fp32", "torch-int8", "llama.cpp-q4_1")
# (draft, target): the torch pairs are the fleet's today; the others put llama.cpp on a side
PAIRS = (("torch-int8", "torch-fp32"), ("llama.cpp-q4_1", "torch-fp32"),
         ("torch-int8", "llama.cpp-q4_1"), ("llama.cpp-q4_1", "llama.cpp-q4_1"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--memory-of", choices=RUNTIMES, help=argparse.SUPPRESS)  # child process
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.memory_of:
        print(json.dumps(_memory_here(args.memory_of)))
        return {}
    import torch

    torch.set_num_threads(1)
    _say("memory: each runtime in a fresh process")
    memory = {name: _memory(name) for name in RUNTIMES}
    models = {name: _load(name) for name in RUNTIMES}
    for m in models.values():
        m.start()
    try:
        prompts = list(SHORT_PROMPTS[:args.prompts])
        speed = {name: asyncio.run(_speed(m, args.tokens)) for name, m in models.items()}
        own = {name: asyncio.run(_own(m, prompts, args.tokens)) for name, m in models.items()}
        spec = [asyncio.run(_speculate(models, draft, target, prompts, args.tokens,
                                       own[target]))
                for draft, target in PAIRS]
    finally:
        for m in models.values():
            m.stop()
    result = {"command": "benchmarks/llm_runtimes.py", "date": time.strftime("%Y-%m-%d"),
              "threads": 1, "prompts": len(prompts), "tokens": args.tokens,
              "runtimes": [{"runtime": n, **memory[n], **speed[n]} for n in RUNTIMES],
              "speculative": spec}
    _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


def _load(name: str) -> Any:
    from tierlink.llm.llamacpp import LlamaCppModel
    from tierlink.llm.runtime import LanguageModel
    from tierlink.llm.source import LMSource

    if name == "llama.cpp-q4_1":
        return LlamaCppModel.load(LMSource(name, "smollm2-135m", runtime="llama.cpp"))
    quantize = "int8" if name == "torch-int8" else None
    return LanguageModel.load(LMSource(name, "smollm2-135m", quantize=quantize))


def _memory(name: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--memory-of", name], check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _memory_here(name: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    before = _rss()
    model = _load(name)
    card = model.card
    lang = card.language
    return {"weights_bytes": _weight_bytes(model), "file_bytes": card.size_bytes, "rss_bytes": _rss() - before,
            "card_prefill_tok_s": lang.prefill_tokens_per_s,
            "card_decode_tok_s": lang.decode_tokens_per_s, "precision": card.precision}


def _weight_bytes(model: Any) -> int:
    """What the weights take in memory: llama.cpp's tensors, or the torch model's (an
    INT8 copy's matrices packed, its embedding and norms in FP32; a tied head once)."""
    if model.runtime == "llama.cpp":
        return int(model.ctx.model_bytes())
    m = model.model
    tensors = [m.embed, m.norm, m.lm_head, *(t for layer in m.layers for t in (
        layer.attn_norm, layer.wqkv, layer.wo, layer.mlp_norm, layer.wgu, layer.wdown))]
    return sum(int(t.nbytes) for t in {id(t): t for t in tensors}.values())


def _rss() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _speed(model: Any, tokens: int) -> dict[str, Any]:
    """Prefill of a long prompt (first-token time) and decode tokens/s, through generate."""
    from tierlink.llm.results import Generation
    from tierlink.llm.sampling import SamplingParams

    rows = []
    for i in range(3):  # a new prompt each time: no runtime reuses a cached prefix
        long = model.chat_ids([{"role": "user", "content": f"Question set {i + 1}: "
                                + " ".join(SHORT_PROMPTS * 3)}])
        report = Generation()
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        async for _ in model.generate(long, params, None, report):
            pass
        t = report.timing
        assert t is not None and t.first_token is not None and t.finished is not None
        rows.append(((t.first_token - t.submitted) * 1e3,
                     (report.completion_tokens - 1) / max(t.finished - t.first_token, 1e-9)))
        _say(f"  {model.name} run {i + 1}: first token {rows[-1][0]:.0f} ms, "
             f"{rows[-1][1]:.1f} tok/s")
    return {"prompt_tokens": len(long),
            "ttft_ms": round(statistics.median(r[0] for r in rows), 1),
            "decode_tok_s": round(statistics.median(r[1] for r in rows), 1)}


async def _own(model: Any, prompts: list[str], tokens: int) -> list[list[int]]:
    from tierlink.llm.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    return [[t async for c in model.generate(_ids(model, p), params) for t in c.tokens]
            for p in prompts]


async def _speculate(models: dict[str, Any], draft: str, target: str, prompts: list[str],
                     tokens: int, own: list[list[int]]) -> dict[str, Any]:
    from tierlink.llm.layer_split import first_divergence
    from tierlink.llm.results import Generation
    from tierlink.llm.sampling import SamplingParams
    from tierlink.llm.speculative import SpecReport, SpeculativeDrafter

    drafter = SpeculativeDrafter(models[draft].draft_model(), models[draft].codec,
                                 ahead=False)
    verifier = models[target]
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    drafted = accepted = produced = 0
    seconds = 0.0
    divergences: list[int | None] = []
    for i, prompt in enumerate(prompts):
        key = f"{draft}>{target}:{i}"

        async def verify(seq: list[int], proposals: list[Any], p: Any, key: str = key) -> Any:
            return await verifier.verify(key, seq, proposals, p)
        spec = SpecReport()
        t0 = time.perf_counter()
        out = [t async for c in drafter.generate(_ids(verifier, prompt), params, verify,
                                                 Generation(), spec) for t in c.tokens]
        seconds += time.perf_counter() - t0
        verifier.release(key)
        drafted, accepted, produced = drafted + spec.drafted, accepted + spec.accepted, \
            produced + len(out)
        divergences.append(first_divergence(out, own[i]))
    row = {"draft": draft, "target": target,
           "acceptance": round(accepted / max(drafted, 1), 3),
           "tokens_per_s": round(produced / seconds, 1),
           "identical": sum(d is None for d in divergences), "compared": len(prompts),
           "first_divergence": divergences}
    _say(f"  {draft} drafting for {target}: acceptance {row['acceptance']}, "
         f"identical {row['identical']}/{len(prompts)}")
    return row


def _ids(model: Any, prompt: str) -> list[int]:
    return list(model.chat_ids([{"role": "user", "content": prompt}]))


def _print(r: dict[str, Any]) -> None:
    print(f"SmolLM2-135M, one thread, {r['prompts']} prompts x {r['tokens']} greedy tokens")
    print(f"{'runtime':<16} {'precision':<9} {'weights MB':>10} {'RSS MB':>7} "
          f"{'first token ms':>15} {'decode tok/s':>13}")
    for row in r["runtimes"]:
        print(f"{row['runtime']:<16} {row['precision']:<9} {row['weights_bytes'] / 1e6:>10.1f} "
              f"{row['rss_bytes'] / 1e6:>7.0f} {row['ttft_ms']:>15} {row['decode_tok_s']:>13}")
    print(f"{'draft':<16} {'target':<16} {'acceptance':>10} {'tok/s':>6} {'identical':>9} "
          "first divergence")
    for row in r["speculative"]:
        div = ", ".join("-" if d is None else str(d) for d in row["first_divergence"])
        print(f"{row['draft']:<16} {row['target']:<16} {row['acceptance']:>10} "
              f"{row['tokens_per_s']:>6} {row['identical']:>4}/{row['compared']:<4} {div}")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
