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


class _SlowModel(_StubModel):
    """A pass takes 0.2 s, as a verifier's pass over a real model does here."""

    def forward(self, steps: list[Step]) -> list[torch.Tensor]:
        time.sleep(0.2)
        return super().forward(steps)


def test_a_lone_verification_waits_for_the_others_it_has_learned_return() -> None:
    """Two devices whose next verifications come back 50 and 65 ms after their verdicts:
    with a 10 ms wait alone they would alternate passes; the learned return gap keeps them
    in one pass."""
    model = _SlowModel()
    engine = Engine(model)  # type: ignore[arg-type]
    engine.expected_verifiers = lambda: 2
    engine.batch_wait_s = 0.01
    engine.start()
    try:
        a, b = KVCache(CFG), KVCache(CFG)
        for round_ in range(3):
            first, second = _Verify(cache=a), _Verify(cache=b)
            engine.submit(first)
            if round_:
                time.sleep(0.015)
            engine.submit(second)
            assert first.done.wait(5) and second.done.wait(5)
            time.sleep(0.05)  # the devices' round trip before their next verifications
    finally:
        engine.stop()
    assert model.batches == [2, 2, 2]
    assert engine.return_gap_s is not None and 0.04 < engine.return_gap_s < 0.2
