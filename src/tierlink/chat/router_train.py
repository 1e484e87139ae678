"""Training a difficulty router on labelled prompts built here, offline.

Each model answers every prompt (label-word likelihood, ``llm/labelled.py``), cached under
``$TIERLINK_HOME/llm/scores``; the prompts split into train (the router), calibration (its
threshold, for the target) and test (the figures a user is shown).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierlink.cascade.tune import Target
from tierlink.chat.router import DifficultyRouter, fit, needs_large, routed_quality, tune_router
from tierlink.errors import ConfigError

SPLITS = (0.5, 0.25, 0.25)  # train, calibration, test
VARIANTS = ("fp32", "int8", "q3")


@dataclass(frozen=True, slots=True)
class Answers:
    """One model's answers to the labelled prompts."""

    probs: np.ndarray
    features: np.ndarray
    labels: np.ndarray

    @property
    def right(self) -> np.ndarray:
        return np.asarray(self.probs.argmax(axis=1) == self.labels)


def answers(variant: str, n: int, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> Answers:
    """SmolLM2 (``fp32``, ``int8`` as devices serve it, or a 3-bit copy ``q3``) on the first
    ``n`` Rotten Tomatoes prompts; cached."""
    from tierlink.llm.weights import llm_root

    if variant not in VARIANTS:
        raise ConfigError(f"unknown model variant {variant!r}", hint=f"one of {VARIANTS}")
    cache = llm_root() / "scores" / f"smollm2-135m-{variant}-rt{seed}-{n}.npz"
    if cache.exists():
        data = np.load(cache)
        return Answers(data["probs"], data["features"], data["labels"])
    probs, features, labels = _score(variant, n, seed, progress)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.stem + ".partial.npz")
    np.savez(tmp, probs=probs, features=features, labels=labels)
    tmp.replace(cache)
    return Answers(probs, features, labels)


def _score(variant: str, n: int, seed: int,
           progress: Callable[[str], None] | None) -> tuple[np.ndarray, ...]:
    import torch

    from tierlink.llm.draft import fake_quantized, int8_draft
    from tierlink.llm.labelled import rotten_tomatoes, score
    from tierlink.llm.model import LlamaModel
    from tierlink.llm.text import TextCodec
    from tierlink.llm.weights import install_model

    torch.set_num_threads(1)
    directory = install_model("smollm2-135m")
    model = LlamaModel.load(directory)
    if variant == "int8":
        model = int8_draft(model)
    elif variant == "q3":
        model = fake_quantized(model, 3)
    items = rotten_tomatoes(seed)[:n]
    start = time.perf_counter()

    def tick(done: int) -> None:
        if progress is not None and (done % 100 == 0 or done == n):
            progress(f"{variant}: {done}/{n} prompts "
                     f"({done / (time.perf_counter() - start):.1f}/s)")
    result = score(model, TextCodec(directory), items, progress=tick)
    return result.probs, result.features, np.asarray([it.label for it in items])


@dataclass(frozen=True, slots=True)
class RouterReport:
    router: DifficultyRouter
    figures: dict[str, Any]


def train_router(small: Answers, large: Answers, target_for: Callable[[float], Target],
                 seed: int = 0) -> RouterReport:
    """Fit on train, tune on calibration for ``target_for(large accuracy on calibration)``,
    report on test beside random routing at the same share of large calls."""
    n = len(small.labels)
    a, b = int(SPLITS[0] * n), int((SPLITS[0] + SPLITS[1]) * n)
    train, cal, test = slice(0, a), slice(a, b), slice(b, n)
    s_right, l_right = small.right, large.right
    router = fit(small.features[train], needs_large(s_right[train], l_right[train]))
    target = target_for(float(l_right[cal].mean()))
    tuned, tuning = tune_router(router, small.features[cal], s_right[cal], l_right[cal],
                                target)
    q: dict[str, Any] = dict(routed_quality(tuned, small.features[test], s_right[test],
                                            l_right[test]))
    rng = np.random.default_rng(seed)
    rand = [np.where(rng.random(n - b) < q["large_share"], l_right[test], s_right[test]).mean()
            for _ in range(200)]
    q.update({"threshold": tuned.threshold, "target": target.describe(),
              "feasible_on_calibration": tuning.feasible,
              "random_same_share": float(np.mean(rand)),
              "gap_to_large_pt": 100 * (q["accuracy"] - q["large_accuracy"]),
              "splits": {"train": a, "calibration": b - a, "test": n - b}})
    return RouterReport(tuned, q)
