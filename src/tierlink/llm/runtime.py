"""A language model as a node serves it: weights, tokenizer, engine, sessions and card, with
an asyncio face (``generate`` streams chunks; ``verify`` judges a device's draft tokens).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch

from tierlink.core.types import Privacy
from tierlink.errors import ConfigError, ContextTooLong, InvalidRequest
from tierlink.llm import weights
from tierlink.llm.card import load_or_measure
from tierlink.llm.engine import Engine
from tierlink.llm.face import EventStream, TextFace, settle
from tierlink.llm.jobs import GenerateJob, VerifyJob
from tierlink.llm.kvcache import CacheBounds
from tierlink.llm.kvship import Holder, identity, pack, slots, unpack
from tierlink.llm.model import LlamaModel
from tierlink.llm.results import Chunk, Generation
from tierlink.llm.sampling import Proposal, SamplingParams, Verdict, generator
from tierlink.llm.sessions import Session, SessionStore
from tierlink.llm.source import LMSource
from tierlink.llm.speculative import TorchDraft
from tierlink.llm.text import Detokenizer, TextCodec
from tierlink.llm.weights import LlamaConfig
from tierlink.models.card import ModelCard


class LanguageModel(TextFace):
    def __init__(self, source: LMSource, model: LlamaModel, codec: TextCodec,
                 card: ModelCard, source_dir: Path | None = None) -> None:
        self.source = source
        self.name = source.name
        self.model = model
        self.codec = codec
        self.card = card
        cfg = model.config
        self.bounds = (CacheBounds.from_bytes(source.kv_cache_bytes, cfg, source.sinks)
                       if source.kv_cache_bytes else None)
        self.engine = Engine(model, max_sequences=source.max_sequences)
        self.sessions = SessionStore(cfg, self.bounds, max_sessions=source.max_sessions)
        self.verifiers = SessionStore(cfg, None, max_sessions=source.max_sessions)
        self._verify_gens: dict[str, torch.Generator] = {}
        # devices' split sequences: this model's layers past their cut (llm/layer_split.py)
        self.tails = SessionStore(cfg, None, max_sessions=source.max_sessions)
        self._tail_gens: dict[str, torch.Generator] = {}
        self._tail_lock = asyncio.Lock()
        # Which KV caches this model computes (a moved conversation loads only where equal)
        self.identity = identity(weights.digest(source_dir), source.quantize or "fp32",
                                 model.exact) if source_dir is not None else ""
        self.engine.expected_verifiers = self._drafting_devices
        self.engine.batch_wait_s = source.verify_batch_wait_ms / 1e3

    @classmethod
    def load(cls, source: LMSource) -> LanguageModel:
        torch.set_num_threads(1)
        directory = weights.resolve(source.path)
        model = LlamaModel.load(directory, exact=source.exact)
        if source.quantize == "int8":
            from tierlink.llm.draft import int8_draft

            model = int8_draft(model)
        elif source.quantize is not None:
            raise ConfigError(f"llm {source.name}: quantize {source.quantize!r} is unknown",
                              hint="use int8, or leave it out")
        codec = TextCodec(directory)
        card = load_or_measure(source.name, directory, model, codec,
                               precision=source.quantize or "fp32")
        return cls(source, model, codec, card, directory)

    def start(self) -> None:
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()

    @property
    def context_length(self) -> int:
        return self.model.config.context_length

    async def generate(self, prompt: list[int], params: SamplingParams,
                       session_key: str | None = None,
                       report: Generation | None = None, privacy: Privacy = Privacy.ANY,
                       origin: str | None = None) -> AsyncIterator[Chunk]:
        """Stream the answer; closing the iterator early cancels the sequence. A session
        remembers the strictest ``privacy`` its turns came with (and their ``origin``)."""
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        self.check_length(prompt, params)
        report = report if report is not None else Generation()
        session = self.sessions.open(session_key)
        session.heard(privacy, origin)
        feed = session.reuse(prompt)
        stream = EventStream()
        job = GenerateJob(session.cache, feed, params, emit=stream.emit,
                          eos_ids=self.codec.eos_ids)
        report.prompt_tokens, report.cached_tokens = len(prompt), len(prompt) - len(feed)
        report.timing = job.timing
        self.engine.submit(job)

        def stop() -> None:  # a stop sequence matched: the engine ends it at its next step
            job.stop_now = True
            self.engine.wake()
        try:
            async for chunk in stream.chunks(Detokenizer(self.codec, params.stop), report,
                                             job.timing, stop):
                yield chunk
        finally:
            if not stream.finished:
                job.cancelled = True
                self.engine.wake()
                await stream.drain()
            session.tokens.extend(job.fed)
            self.sessions.close(session_key, session)

    async def verify(self, key: str, tokens: list[int], drafts: list[Proposal],
                     params: SamplingParams) -> Verdict:
        """Judge ``drafts`` after ``tokens`` (the device's whole sequence so far)."""
        if not tokens:
            raise InvalidRequest("verify: tokens is empty")
        if len(tokens) + len(drafts) + 1 > self.context_length:
            raise ContextTooLong(f"verify: {len(tokens) + len(drafts)} tokens is over the "
                                 f"context length of {self.context_length}")
        session = self.verifiers.open(key)
        gen = self._verify_gens.setdefault(key, generator(params.seed))
        try:
            feed = session.reuse(tokens)
            loop = asyncio.get_running_loop()
            done: asyncio.Future[Verdict] = loop.create_future()

            def resolve(verdict: Verdict | None, exc: BaseException | None) -> None:
                loop.call_soon_threadsafe(settle, done, verdict, exc)

            job = VerifyJob(session.cache, feed, drafts, params, resolve, gen)
            self.engine.submit(job)
            try:
                verdict = await asyncio.shield(done)
            except asyncio.CancelledError:
                job.cancelled = True
                self.engine.wake()
                await asyncio.wait([done])
                raise
            session.tokens = [*tokens, *(d.token for d in drafts[:verdict.accepted])]
            return verdict
        except BaseException:
            session.tokens = session.tokens[:session.cache.length]
            raise
        finally:
            self.verifiers.close(key, session)
            if key not in self.verifiers:
                self._verify_gens.pop(key, None)

    async def split_tail(self, key: str, hidden: torch.Tensor, cut: int,
                         params: SamplingParams) -> int:
        """A device's split sequence ``key``: its next rows' hidden states after layer
        ``cut`` (fed as :func:`~tierlink.llm.layer_split.head_rows` fed them) through the
        rest of this model; the next token it picks. Tails run one at a time, beside the
        engine."""
        from tierlink.llm.layer_split import tail_rows
        from tierlink.llm.sampling import sample

        if not 0 < cut < self.config.num_layers or hidden.ndim != 2 \
                or hidden.shape[1] != self.config.hidden_size or not hidden.shape[0]:
            raise InvalidRequest(f"split: hidden states must be rows x "
                                 f"{self.config.hidden_size} after a cut in 1.."
                                 f"{self.config.num_layers - 1}")
        session = self.tails.open(key)
        gen = self._tail_gens.setdefault(key, generator(params.seed))
        try:
            if session.cache.length + hidden.shape[0] > self.context_length:
                raise ContextTooLong(f"split: over the context length of "
                                     f"{self.context_length}")
            async with self._tail_lock:
                logits = await asyncio.to_thread(tail_rows, self.model, session.cache,
                                                 hidden, cut)
            session.tokens.extend([-1] * hidden.shape[0])
            return sample(logits, params, gen)
        finally:
            self.tails.close(key, session)

    def release_tail(self, key: str) -> bool:
        """A device is done with split sequence ``key``: free its cache here."""
        self._tail_gens.pop(key, None)
        return self.tails.drop(key)

    async def export(self, key: str, codec: str, since: tuple[int, int] | None = None,
                     ) -> tuple[bytes, Holder]:
        """Conversation ``key``'s cache as a package (``llm/kvship.py``), packed off the
        event loop. ``since`` (slots, evicted) of a copy taken earlier: only the slots after
        them (a delta), unless the cache has evicted since or holds fewer — then the whole
        cache. A session answering a turn is refused (409). A conversation moving away is
        held (busy) while it is packed; a copy's slots are copied at once and packed while
        the conversation goes on — taking a copy never holds up its next turn."""
        session = self.sessions.take(key)
        holder = Holder(tuple(session.tokens), session.privacy, session.origin)
        cache = session.cache
        if since is not None:  # a copy: the slots as they are now
            start = since[0] if since[1] == cache.evicted and 0 <= since[0] <= cache.length \
                else 0
            taken = slots(cache, start, copy=True)
            self.sessions.untake(session)
            return await asyncio.to_thread(pack, taken, holder, self.identity, codec), holder
        try:
            blob = await asyncio.to_thread(pack, cache, holder, self.identity, codec)
        finally:
            self.sessions.untake(session)
        return blob, holder

    async def adopt(self, key: str, blob: bytes) -> Holder:
        """Hold a moved conversation's cache as session ``key`` (checked: this model's,
        whole, of the tokens it says)."""
        cache, holder = await asyncio.to_thread(unpack, blob, self.model.config,
                                                self.identity, self.bounds)
        session = Session(cache, list(holder.tokens), privacy=holder.privacy,
                          origin=holder.origin)
        self.sessions.put(key, session)
        return holder

    @property
    def config(self) -> LlamaConfig:
        return self.model.config

    def held(self, key: str) -> Session | None:
        """Conversation ``key``'s session, if held here (what a move or a copy takes)."""
        return self.sessions.get(key)

    def draft_model(self) -> TorchDraft:
        """A draft on this model (its weights; a KV cache per answer)."""
        return TorchDraft(self.model)

    def _drafting_devices(self) -> int:
        """Verifier sessions used in the last second: devices drafting right now."""
        return self.verifiers.recent(1.0)

    async def prompt_features(self, prompt: list[int]) -> Any:
        """The model's final hidden state of the prompt (numpy), what a router reads."""
        from tierlink.llm.kvcache import KVCache
        from tierlink.llm.model import Step

        def run() -> Any:
            _, hidden = self.model.features(Step(KVCache(self.model.config), prompt,
                                                 block=True))
            return hidden.numpy()
        return await asyncio.to_thread(run)

    def release(self, key: str) -> bool:
        """A drafting device is done with ``key``: free its cache and generator now."""
        dropped = self.verifiers.drop(key)
        if dropped:
            self._verify_gens.pop(key, None)
        return dropped

    def status(self) -> dict[str, Any]:
        s = self.engine.stats
        return {"name": self.name, "running": s.running, "queued": s.queued,
                "passes": s.passes, "rows": s.rows, "busy_s": round(s.busy_s, 3),
                "sessions": len(self.sessions), "verifier_sessions": len(self.verifiers),
                "kv_bytes": self.kv_bytes_in_use(),
                "kv_cap_bytes": self.source.kv_cache_bytes}

    def kv_bytes_in_use(self) -> int:
        return self.sessions.bytes_in_use() + self.verifiers.bytes_in_use()


__all__ = ["Chunk", "Generation", "LMSource", "LanguageModel", "Session"]


def load_language_model(spec: Any) -> LanguageModel:
    """The ``llm`` format's runtime factory (:mod:`tierlink.models.runtimes`): the model a
    node spec's ``llms:`` entry (``spec.options["source"]``, an :class:`LMSource`) names."""
    source = spec.options.get("source")
    if not isinstance(source, LMSource):
        raise ConfigError(f"a language model is loaded from a node's llms: entry, not from "
                          f"{spec.card} alone", hint="list it under llms: in the fleet file")
    return LanguageModel.load(source)
