"""How a node spec names a language model (torch-free: specs load in every process)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from tierlink.errors import ModelNotFound

M = TypeVar("M")

MOVES = ("auto", "always", "never")  # when a conversation's cache follows its next turn
CODECS = ("fp32", "fp16", "int8", "int4")  # a cache on the wire (llm/kvship.py)
# what computes a model, and the card format the runtime registry serves it by
# (tierlink.models.runtimes): our torch decoder, or llama.cpp on the GGUF as it ships
RUNTIMES = {"torch": "llm", "llama.cpp": "gguf"}


@dataclass(frozen=True, slots=True)
class LMSource:
    """A language model in a node spec: ``path`` is a model directory or a packaged name."""

    name: str  # what requests and /v1/models call the model
    path: str  # a packaged model (`tierlink llm list`) or a model directory
    runtime: str = "torch"  # one of RUNTIMES
    kv_cache_bytes: int | None = None  # bounded cache per sequence (sliding window + sinks)
    sinks: int = 4
    max_sequences: int = 16  # sequences generated at once; more requests wait their turn
    max_sessions: int = 64
    exact: bool = True  # batch-invariant kernels (required to verify drafts)
    # "int8": serve an INT8 copy (a device's own model, and its speculative draft)
    quantize: str | None = None
    # "NODE/MODEL": draft for that upstream node's model (speculative decoding)
    verifier: str | None = None
    verifier_tier: str = "cloud"
    k_max: int = 8
    # draft the next round while this one is verified (llm/speculative.py): no drafting
    # between rounds when the verdict takes every proposal and the guess after them
    draft_ahead: bool = True
    # a difficulty router (JSON, chat/router.py): prompts it scores above its threshold go to
    # the verifier's large model (speculatively); the rest are answered here
    router: str | None = None
    # the model's quality on the fleet's labelled prompts (0..1, e.g. `benchmarks/llm_route.py`):
    # chat placement weighs it against time and cost; None: not measured
    quality: float | None = None
    # a verifier holds a verification up to this long for other devices' (one pass for all)
    verify_batch_wait_ms: float = 10.0
    # "NODE/MODEL": run only the embedding and the first `split_cut` layers here and send
    # the hidden states (codec `split_codec`) to that upstream's copy of this model for the
    # rest (llm/layer_split.py) — where the fleet lets a prompt's features leave
    split: str | None = None
    split_tier: str = "cloud"  # the split target's tier (filled in from the fleet file)
    split_cut: int = 8  # decoder layers run here: the embedding and layers 0..cut-1
    # the hidden states on the wire: fp16 (the unsplit greedy output in our runs, half of
    # fp32's bytes), fp32 (exact), int8 or int8c (per channel)
    split_codec: str = "fp16"
    # a conversation's cache shipped to the upstream that answers its next turn
    # (chat/handover.py): auto (when faster than prefilling there), always or never; and its
    # codec on the wire (fp32: exact; fp16; int8: a quarter of the bytes; int4: 16%)
    kv_move: str = "auto"
    kv_codec: str = "int8"

    @property
    def format(self) -> str:
        """The card format its runtime is registered under."""
        return RUNTIMES[self.runtime]


def model_named(models: Mapping[str, M], name: str, purpose: str) -> M:
    """This node's language model ``name`` (a route's path names it), or a 404 saying what
    it was wanted for and which models are here."""
    lm = models.get(name)
    if lm is None:
        raise ModelNotFound(f"no language model {name!r} here {purpose}",
                            hint=f"models: {sorted(models)}")
    return lm
