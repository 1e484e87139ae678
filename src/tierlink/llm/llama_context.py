"""One llama.cpp context (llama-cpp-python's bindings) over a GGUF file as it ships: tokens
fed in chunks, the logits of the rows asked for, the sequence cut back, saved and restored.

Built only by ``./scripts/setup.sh --llama`` (llama-cpp-python compiles for ~6 minutes);
without it, loading says so. A context is not thread-safe: one thread drives it
(:class:`tierlink.llm.llamacpp.LlamaEngine`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import ContextTooLong, ModelError, RuntimeFailure

N_BATCH = 128  # rows per llama_decode call: a prompt prefills in chunks of this many
INSTALL_HINT = "build the llama.cpp runtime: ./scripts/setup.sh --llama"


def bindings() -> Any:
    """The ``llama_cpp`` module, or a ModelError saying how to build it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ModelError(f"the llama.cpp runtime is not installed ({exc})",
                         hint=INSTALL_HINT) from exc
    return llama_cpp


class LlamaContext:
    """``tokens``: what the context's sequence holds, in order."""

    def __init__(self, path: Path, n_ctx: int, threads: int = 1) -> None:
        ll = bindings()
        self._ll = ll
        self.path = path
        try:
            self.llama = ll.Llama(str(path), n_ctx=n_ctx, n_batch=N_BATCH, n_ubatch=N_BATCH,
                                  n_threads=threads, n_threads_batch=threads, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp cannot load {path}: {exc}") from exc
        self.ctx = self.llama._ctx.ctx
        self.n_ctx = n_ctx
        self.n_vocab = int(self.llama.n_vocab())
        self._batch = ll.llama_batch_init(N_BATCH, 0, 1)
        self.tokens: list[int] = []

    @property
    def description(self) -> str:
        """llama.cpp's words for the model: architecture, size and quantization."""
        return str(self.llama._model.desc())

    def model_bytes(self) -> int:
        return int(self._ll.llama_model_size(self.llama._model.model))

    def parameters(self) -> int:
        return int(self._ll.llama_model_n_params(self.llama._model.model))

    def metadata(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.llama.metadata.items()}

    def prefill(self, tokens: list[int]) -> None:
        """Feed ``tokens`` after what the context holds, reading no logits."""
        for at in range(0, len(tokens), N_BATCH):
            self._decode(tokens[at:at + N_BATCH], outputs=0)

    def step(self, tokens: list[int]) -> np.ndarray:
        """Feed ``tokens`` (at most :data:`N_BATCH`) as one batch; the logits of every one
        of them, ``(len(tokens), vocab)`` float32."""
        if not 0 < len(tokens) <= N_BATCH:
            raise ValueError(f"a step feeds 1 to {N_BATCH} tokens, not {len(tokens)}")
        self._decode(tokens, outputs=len(tokens))
        rows = [np.ctypeslib.as_array(self._ll.llama_get_logits_ith(self.ctx, i),
                                      shape=(self.n_vocab,)) for i in range(len(tokens))]
        return np.stack(rows).astype(np.float32, copy=True)

    def keep(self, n: int) -> None:
        """Cut the sequence back to its first ``n`` tokens."""
        if n < len(self.tokens):
            self._ll.llama_memory_seq_rm(self._ll.llama_get_memory(self.ctx), 0, n, -1)
            del self.tokens[n:]

    def save(self) -> bytes:
        """The sequence's state (its KV cache), to :meth:`load` later."""
        size = int(self._ll.llama_state_seq_get_size(self.ctx, 0))
        buf = (ctypes.c_uint8 * size)()
        n = int(self._ll.llama_state_seq_get_data(self.ctx, buf, size, 0))
        return ctypes.string_at(buf, n)

    def load(self, state: bytes, tokens: list[int]) -> None:
        """Hold a sequence saved by :meth:`save` (of ``tokens``) instead of this one."""
        self.keep(0)
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if int(self._ll.llama_state_seq_set_data(self.ctx, buf, len(state), 0)) == 0:
            raise RuntimeFailure("llama.cpp could not restore a saved sequence")
        self.tokens = list(tokens)

    def close(self) -> None:
        if self._batch is not None:
            self._ll.llama_batch_free(self._batch)
            self._batch = None
            self.llama.close()

    def _decode(self, tokens: list[int], outputs: int) -> None:
        """One llama_decode of ``tokens``; the last ``outputs`` rows keep their logits."""
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ContextTooLong(f"{len(self.tokens) + len(tokens)} tokens is over this "
                                 f"context's {self.n_ctx}")
        batch, base, n = self._batch, len(self.tokens), len(tokens)
        batch.n_tokens = n
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = base + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= n - outputs
        status = int(self._ll.llama_decode(self.ctx, batch))
        if status != 0:
            raise RuntimeFailure(f"llama_decode returned {status}")
        self.tokens.extend(tokens)
