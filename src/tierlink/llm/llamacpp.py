"""A language model on llama.cpp: the GGUF file served as it ships (SmolLM2's Q4_1 on a
device), beside the torch runtime (``llm/runtime.py``) and chosen per model in the fleet
file (``runtime: llama.cpp``; the card's format ``gguf``).

The same face as the torch runtime's :class:`~tierlink.llm.runtime.LanguageModel`: the
OpenAI API generates with it, a device drafts with it (:class:`LlamaDraft`), a verifier
judges drafts with it. The tokenizer and chat template are the model directory's
(``llm/text.py``), so token ids agree with the torch runtime's and either runtime drafts for
the other. What it does not do: batch sequences (requests run one at a time, in order: a
device's model), move or copy conversations (their caches are llama.cpp's own; a session's
next turn goes back to it), slide a bounded cache, or read prompt features for a router.

Verification feeds the drafts as one batch (as the torch verifier does) and decoding one
row at a time; llama.cpp's CPU kernels can round a batch's rows differently from single
rows, so speculative greedy output may part from llama.cpp's own greedy output —
``benchmarks/llm_runtimes.py`` reports the first divergent token wherever it does.
"""

from __future__ import annotations

import asyncio
import functools
import os
import platform
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from tierlink.errors import (
    ConfigError,
    InvalidRequest,
    ModelError,
    PackageRefused,
    SessionNotFound,
)
from tierlink.llm import weights
from tierlink.llm.card import cached_card, measured_for
from tierlink.llm.face import EventStream, TextFace, settle
from tierlink.llm.jobs import Decoding
from tierlink.llm.kvship import Holder
from tierlink.llm.llama_context import LlamaContext
from tierlink.llm.llama_engine import LlamaEngine, LlamaSessions
from tierlink.llm.results import Chunk, Generation, Timing
from tierlink.llm.sampling import Proposal, SamplingParams, Verdict, accept_drafts, generator
from tierlink.llm.sampling import propose as propose_token
from tierlink.llm.source import LMSource
from tierlink.llm.text import Detokenizer, TextCodec
from tierlink.llm.weights import LlamaConfig
from tierlink.models.card import LanguageInfo, ModelCard

RUNTIME = "llama.cpp"
FORMAT = "gguf"  # the card format the runtime registry maps to this runtime
MAX_CONTEXT = 4096  # positions a context holds (the KV cache is allocated for all of them)
CARD = "card-llama.cpp.json"
VERIFYING = "verify:"  # a drafting device's sequence among the conversations


def gguf_of(path: str) -> tuple[Path, Path]:
    """(the GGUF file, the directory whose tokenizer reads it) of a source's ``path``: a
    packaged model (its GGUF as shipped; its converted directory for the tokenizer), or a
    directory holding one ``.gguf`` beside a ``tokenizer.json``."""
    given = Path(path).expanduser()
    if given.is_dir():
        found = sorted(given.glob("*.gguf"))
        if len(found) != 1:
            raise ModelError(f"{given} holds {len(found)} .gguf files, not one",
                             hint="point the model at a directory with one GGUF file and "
                                  "its tokenizer.json")
        return found[0], given
    return weights.packaged_gguf(path), weights.resolve(path)


class LlamaCppModel(TextFace):
    runtime = RUNTIME

    def __init__(self, source: LMSource, ctx: LlamaContext, codec: TextCodec,
                 card: ModelCard, gguf: Path, config: LlamaConfig) -> None:
        self.source = source
        self.config = config  # the architecture (what a verification's token ids are checked by)
        self.name = source.name
        self.ctx = ctx
        self.codec = codec
        self.card = card
        self.gguf = gguf
        self.identity = ""  # its caches never move (a handover needs equal identities)
        self.engine = LlamaEngine()
        self.sessions = LlamaSessions(ctx, max_sessions=source.max_sessions)
        self._verify_gens: dict[str, torch.Generator] = {}
        self._draft: LlamaDraft | None = None

    @classmethod
    def load(cls, source: LMSource) -> LlamaCppModel:
        _check_source(source)
        gguf, directory = gguf_of(source.path)
        codec = TextCodec(directory)
        config = weights.read_config(directory)
        n_ctx = min(config.context_length, MAX_CONTEXT)
        before = _rss_bytes()
        ctx = LlamaContext(gguf, n_ctx)
        card = card_for(source.name, gguf, directory, ctx, codec, _rss_bytes() - before)
        return cls(source, ctx, codec, card, gguf, config)

    def start(self) -> None:
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()
        if self._draft is not None:
            self._draft.close()

    @property
    def context_length(self) -> int:
        return self.ctx.n_ctx

    async def generate(self, prompt: list[int], params: SamplingParams,
                       session_key: str | None = None, report: Generation | None = None,
                       privacy: Any = None, origin: str | None = None,
                       ) -> AsyncIterator[Chunk]:
        """Stream the answer (see :meth:`LanguageModel.generate`); ``privacy`` and
        ``origin`` are not kept: a llama.cpp conversation never leaves this node."""
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        self.check_length(prompt, params)
        report = report if report is not None else Generation()
        stream = EventStream()
        timing = Timing(time.monotonic(), prompt_tokens=len(prompt))
        run = _Run(session_key, prompt, Decoding(params, stream.emit, self.codec.eos_ids,
                                                 timing), report)
        report.prompt_tokens, report.timing = len(prompt), timing
        self.engine.submit(lambda: self._generate(run))
        try:
            async for chunk in stream.chunks(Detokenizer(self.codec, params.stop), report,
                                             timing, functools.partial(setattr, run,
                                                                       "stop_now", True)):
                yield chunk
        finally:
            if not stream.finished:
                run.cancelled = True
                await stream.drain()  # the run's last event: the context is free again

    def _generate(self, run: _Run) -> None:
        """On the engine's thread: prefill what the context lacks, then decode."""
        try:
            reused, first = self._fed(run.key, run.prompt)
            run.report.cached_tokens = reused  # before any event
            last: int | None = first
            while last is not None:
                if run.cancelled or run.stop_now:
                    run.decoding.finish("stop" if run.stop_now else "cancelled", [])
                    return
                row = self.engine.timed(1, functools.partial(self.ctx.step, [last]))[-1]
                last = run.decoding.choose(torch.from_numpy(row))
        except Exception as exc:  # noqa: BLE001  (the caller hears every failure as an event)
            run.decoding.fail(exc)
        finally:
            self.sessions.leave(run.key)

    async def verify(self, key: str, tokens: list[int], drafts: list[Proposal],
                     params: SamplingParams) -> Verdict:
        """Judge ``drafts`` after ``tokens`` (the device's whole sequence so far)."""
        if not tokens:
            raise InvalidRequest("verify: tokens is empty")
        self.check_length(tokens, SamplingParams(max_tokens=len(drafts) + 1))
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Verdict] = loop.create_future()
        gen = self._verify_gens.setdefault(key, generator(params.seed))

        def judge() -> None:
            try:
                verdict = self._judge(key, tokens, drafts, params, gen)
            except Exception as exc:  # noqa: BLE001  (the caller's future carries it)
                loop.call_soon_threadsafe(settle, done, None, exc)
            else:
                loop.call_soon_threadsafe(settle, done, verdict, None)

        self.engine.submit(judge)
        return await done

    def _judge(self, key: str, tokens: list[int], drafts: list[Proposal],
               params: SamplingParams, gen: torch.Generator) -> Verdict:
        """On the engine's thread: the pending tokens' prefill, then the last of them and
        the drafts as one batch (as the torch verifier feeds them)."""
        session = _verifier_key(key)
        try:
            _, last = self._fed(session, tokens)
            rows = self.engine.timed(len(drafts) + 1, lambda: self.ctx.step(
                [last, *(d.token for d in drafts)]))
            verdict = accept_drafts(torch.from_numpy(rows), drafts, params, gen)
            self.ctx.keep(len(tokens) + verdict.accepted)
            return verdict
        finally:
            self.sessions.leave(session)

    def _fed(self, key: str | None, tokens: list[int]) -> tuple[int, int]:
        """On the engine's thread: the context holding the most of ``tokens`` it can
        (``key``'s sequence, or a shared prefix), then all but the last of the rest fed.
        (Tokens reused, the last token: to step.)"""
        feed = self.sessions.enter(key, tokens)
        if len(feed) > 1:
            self.engine.timed(len(feed) - 1, lambda: self.ctx.prefill(feed[:-1]))
        return len(tokens) - len(feed), feed[-1]

    def release(self, key: str) -> bool:
        """A drafting device is done with ``key``: forget its sequence."""
        self._verify_gens.pop(key, None)
        return self.sessions.drop(_verifier_key(key))

    def held(self, key: str) -> None:
        """A conversation to move or copy: never one of llama.cpp's (its cache stays)."""

    async def export(self, key: str, codec: str, since: tuple[int, int] | None = None,
                     ) -> tuple[bytes, Holder]:
        raise SessionNotFound(f"conversation {key!r}: the llama.cpp runtime does not "
                              "export conversations")

    async def adopt(self, key: str, blob: bytes) -> Holder:
        raise PackageRefused(f"model {self.name} runs on llama.cpp, which does not take "
                             "moved conversations", hint="move it to a torch-runtime node")

    async def split_tail(self, key: str, hidden: Any, cut: int,
                         params: SamplingParams) -> int:
        raise InvalidRequest(f"model {self.name} runs on llama.cpp, which does not run a "
                             "split's upper layers", hint="split toward a torch-runtime model")

    def release_tail(self, key: str) -> bool:
        return False

    async def prompt_features(self, prompt: list[int]) -> Any:
        raise InvalidRequest(f"model {self.name} (llama.cpp) reads no prompt features")

    def draft_model(self) -> LlamaDraft:
        """A draft on this GGUF, with a context of its own (the weights are shared)."""
        if self._draft is None:
            self._draft = LlamaDraft(LlamaContext(self.gguf, self.ctx.n_ctx),
                                     self.source.max_sessions)
        return self._draft

    def status(self) -> dict[str, Any]:
        s = self.engine.stats
        verifying = sum(1 for key in self.sessions if key.startswith(VERIFYING))
        return {"name": self.name, "runtime": RUNTIME, "running": s.running,
                "queued": s.queued, "passes": s.passes, "rows": s.rows,
                "busy_s": round(s.busy_s, 3), "sessions": len(self.sessions) - verifying,
                "verifier_sessions": verifying, "kv_bytes": self.kv_bytes_in_use(),
                "kv_cap_bytes": None}

    def kv_bytes_in_use(self) -> int:
        return self.sessions.bytes_in_use()


class LlamaDraft:
    """A device's draft on llama.cpp (``llm/speculative.py``'s ``DraftModel``): one
    context, drafts one at a time; each answer's sequence is a conversation of its own
    (:class:`LlamaSessions`: parked while another answer drafts, restored for its next
    round), cut back each round to what the round shares with it."""

    def __init__(self, ctx: LlamaContext, max_answers: int = 64) -> None:
        self.ctx = ctx
        self.answers = LlamaSessions(ctx, max_sessions=max_answers)

    def new_cache(self) -> str:
        return uuid.uuid4().hex  # the answer's key among the draft's sequences

    def propose(self, cache: str, tokens: list[int], k: int, params: SamplingParams,
                gen: torch.Generator, stop: Any = None) -> list[Proposal]:
        pending = self.answers.enter(cache, tokens)
        if len(pending) > 1:
            self.ctx.prefill(pending[:-1])
        proposals: list[Proposal] = []
        last = pending[-1]
        for _ in range(k):
            if proposals and stop is not None and stop.is_set():
                break
            row = self.ctx.step([last])[-1]
            proposal = propose_token(torch.from_numpy(row), params, gen)
            proposals.append(proposal)
            last = proposal.token
        return proposals

    def close(self) -> None:
        self.ctx.close()


class _Run:
    """One generation on the engine's thread; ``cancelled``/``stop_now`` set by the caller."""

    def __init__(self, key: str | None, prompt: list[int], decoding: Decoding,
                 report: Generation) -> None:
        self.key, self.prompt, self.decoding, self.report = key, prompt, decoding, report
        self.cancelled = False
        self.stop_now = False


def card_for(name: str, gguf: Path, directory: Path, ctx: LlamaContext, codec: TextCodec,
             rss_bytes: int) -> ModelCard:
    """The card beside the tokenizer if measured for this GGUF on this machine; else
    measured now (prefill and decode tokens/s on one thread, memory) and written there."""
    key = measured_for(gguf)
    return cached_card(directory / CARD, key,
                       lambda: measure(name, gguf, ctx, codec, rss_bytes, key))


def measure(name: str, gguf: Path, ctx: LlamaContext, codec: TextCodec, rss_bytes: int,
            key: str, prompt_tokens: int = 128, decode_tokens: int = 24) -> ModelCard:
    meta = ctx.metadata()
    arch = meta.get("general.architecture", "llama")
    layers = int(meta.get(f"{arch}.block_count", 0))
    heads = int(meta.get(f"{arch}.attention.head_count", 1))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    hidden = int(meta.get(f"{arch}.embedding_length", 0))
    prompt = [(17 + 31 * i) % ctx.n_vocab for i in range(prompt_tokens)]
    ctx.keep(0)
    t0 = time.perf_counter()
    ctx.prefill(prompt[:-1])
    ctx.step(prompt[-1:])
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(decode_tokens):
        ctx.step([(prompt[-1] + i) % ctx.n_vocab])
    decode_s = time.perf_counter() - t0
    ctx.keep(0)
    language = LanguageInfo(
        architecture=arch, context_length=ctx.n_ctx, layers=layers, hidden_size=hidden,
        kv_bytes_per_token=2 * layers * kv_heads * (hidden // max(heads, 1)) * 2,  # f16
        prefill_tokens_per_s=round(prompt_tokens / prefill_s, 1),
        decode_tokens_per_s=round(decode_tokens / decode_s, 1),
        tokenizer=MappingProxyType({"kind": codec.name, "vocab_size": codec.vocab_size(),
                                    "chat_template": codec.template_text is not None}),
        source=MappingProxyType({"gguf": gguf.name, "bytes": gguf.stat().st_size}),
        measured=MappingProxyType({"runtime": RUNTIME, "threads": 1,
                                   "prompt_tokens": prompt_tokens,
                                   "decode_tokens": decode_tokens,
                                   "model": ctx.description, "model_bytes": ctx.model_bytes(),
                                   "rss_bytes": rss_bytes, "machine": platform.machine()}),
        measured_for=key)
    return ModelCard(name=name, task="chat", version="1", format=FORMAT, file=gguf.name,
                     params=ctx.parameters(), size_bytes=gguf.stat().st_size,
                     precision=_precision(ctx.description), language=language)


def load_gguf_model(spec: Any) -> LlamaCppModel:
    """The ``gguf`` format's runtime factory (:mod:`tierlink.models.runtimes`)."""
    source = spec.options.get("source")
    if not isinstance(source, LMSource):
        raise ConfigError(f"a language model is loaded from a node's llms: entry, not from "
                          f"{spec.card} alone", hint="list it under llms: in the fleet file")
    return LlamaCppModel.load(source)


def _check_source(source: LMSource) -> None:
    unsupported = {"quantize": source.quantize, "kv_cache_bytes": source.kv_cache_bytes,
                   "router": source.router}
    given = [k for k, v in unsupported.items() if v is not None]
    if given:
        raise ConfigError(f"llm {source.name}: the llama.cpp runtime takes no "
                          f"{', '.join(given)}",
                          hint="a GGUF is served as it ships (its own quantization)")


def _precision(description: str) -> str:
    """The quantization llama.cpp names last in its description (``llama 135M Q4_1``)."""
    return description.rsplit(" ", 1)[-1].lower() if description else "gguf"


def _verifier_key(key: str) -> str:
    return f"{VERIFYING}{key}"


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


__all__ = ["FORMAT", "RUNTIME", "LlamaCppModel", "LlamaDraft", "gguf_of", "load_gguf_model"]
