"""What a served language model does with text whichever runtime computes it: chat
templates and tokens in, the length check, the runtime's name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from tierlink.errors import ContextTooLong, InvalidRequest, RuntimeFailure, TierlinkError
from tierlink.llm.jobs import Event
from tierlink.llm.params import SamplingParams
from tierlink.llm.results import Chunk, Generation, Timing
from tierlink.llm.sampling import Verdict
from tierlink.llm.source import LMSource
from tierlink.llm.text import Detokenizer, TextCodec

if TYPE_CHECKING:
    from tierlink.llm.llamacpp import LlamaCppModel
    from tierlink.llm.runtime import LanguageModel

# A language model a node serves, on either runtime (the chat layer takes both)
ServedModel: TypeAlias = "LanguageModel | LlamaCppModel"


class TextFace:
    """``bounds``: a sliding-window cache (any length generates), or None."""

    runtime = "torch"
    source: LMSource
    codec: TextCodec
    bounds: Any = None

    @property
    def context_length(self) -> int:
        raise NotImplementedError

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.codec.encode(self.codec.chat_prompt(messages))

    def text_ids(self, prompt: str) -> list[int]:
        if not prompt:
            raise InvalidRequest("prompt is empty")
        return self.codec.encode(prompt)

    def check_length(self, prompt: list[int], params: SamplingParams) -> None:
        if self.bounds is not None:
            return  # a bounded cache slides: any length generates
        if len(prompt) + params.max_tokens > self.context_length:
            raise ContextTooLong(
                f"the prompt has {len(prompt)} tokens and max_tokens is {params.max_tokens}: "
                f"over this model's context length of {self.context_length}")


def settle(fut: asyncio.Future[Verdict], verdict: Verdict | None,
           exc: BaseException | None) -> None:
    """Resolve a verification's future on the event loop (a verdict, a failure, or
    cancelled when neither)."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(as_error(exc))
    elif verdict is None:
        fut.cancel()
    else:
        fut.set_result(verdict)


def as_error(exc: BaseException) -> TierlinkError:
    """A runtime's failure as the error tree names it."""
    if isinstance(exc, TierlinkError):
        return exc
    return RuntimeFailure(f"language model failed: {exc}")


class EventStream:
    """A generation's events, emitted on the runtime's thread (:attr:`emit`), read on the
    event loop as the answer's chunks: text detokenized, stop sequences honoured (``stop``
    asks the runtime to end it), ``report`` kept current."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.finished = False

    def emit(self, event: Event) -> None:
        """From any thread: the event, queued on the loop."""
        self._loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def chunks(self, detok: Detokenizer, report: Generation, timing: Timing,
                     stop: Callable[[], None]) -> AsyncIterator[Chunk]:
        while not self.finished:
            event = await self.events.get()
            self.finished = event.finish_reason is not None
            chunk = piece(event, detok, report, timing)
            if detok.stopped and not self.finished:
                stop()
            if chunk is not None:
                yield chunk

    async def drain(self) -> None:
        """Wait for a cancelled generation's last event (its cache is free after it)."""
        while not self.finished:
            self.finished = (await self.events.get()).finish_reason is not None


def piece(event: Event, detok: Detokenizer, report: Generation, timing: Timing
          ) -> Chunk | None:
    """One event of a generation as the answer's chunk (None: no text to send yet), with
    ``report`` kept current; a failure raised as the error tree names it."""
    if event.error is not None:
        raise as_error(event.error)
    finished = event.finish_reason is not None
    text = detok.push(event.tokens)
    if finished:
        text += detok.flush()
        report.finish_reason = "stop" if detok.stopped else event.finish_reason
    report.completion_tokens = timing.generated
    report.text.append(text)
    if not text and not finished:
        return None
    return Chunk(text, event.tokens, report.finish_reason if finished else None)
