"""What a served language model does with text whichever runtime computes it: chat
templates and tokens in, the length check, the runtime's name."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeAlias

from tierlink.errors import ContextTooLong, InvalidRequest, RuntimeFailure, TierlinkError
from tierlink.llm.params import SamplingParams
from tierlink.llm.sampling import Verdict
from tierlink.llm.source import LMSource
from tierlink.llm.text import TextCodec

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
