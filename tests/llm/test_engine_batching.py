"""The engine's continuous batching with a stub model: verifications of several devices
wait briefly for each other and share one pass."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from tierlink.llm.engine import Engine
from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import Step
from tierlink.llm.weights import LlamaConfig

CFG = LlamaConfig(vocab_size=8, hidden_size=4, intermediate_size=8, num_layers=1,
                  num_heads=1, num_kv_heads=1, head_dim=4, rms_norm_eps=1e-5,
                  rope_theta=1e4, context_length=64, bos_token_id=1, eos_token_ids=(2,))


class _StubModel:
    def __init__(self) -> None:
        self.batches: list[int] = []
        self.rope = type("R", (), {"shift": staticmethod(lambda k, _by: k)})()

    def forward(self, steps: list[Step]) -> list[torch.Tensor]:
        self.batches.append(len(steps))
        return [torch.zeros(len(s.tokens), CFG.vocab_size) for s in steps]


@dataclass
class _Verify:
    cache: KVCache = field(default_factory=lambda: KVCache(CFG))
    cancelled: bool = False
    kind: str = "verify"
    submitted: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)

    def next_step(self) -> Step:
        return Step(self.cache, [3, 4], all_logits=True)

    def take(self, logits: torch.Tensor) -> bool:
        self.done.set()
        return True

    def cancel_if_asked(self) -> bool:
        return False

    def fail(self, exc: BaseException) -> None:
        self.done.set()


def _run(wait_s: float) -> list[int]:
    model = _StubModel()
    engine = Engine(model)  # type: ignore[arg-type]
    engine.expected_verifiers = lambda: 2
    engine.batch_wait_s = wait_s
    engine.start()
    try:
        first, second = _Verify(), _Verify()
        engine.submit(first)
        time.sleep(0.05)
        engine.submit(second)
        assert first.done.wait(5) and second.done.wait(5)
    finally:
        engine.stop()
    return model.batches


def test_verifications_wait_for_each_other() -> None:
    assert _run(0.5) == [2]


def test_without_a_wait_each_goes_alone() -> None:
    assert _run(0.0) == [1, 1]
