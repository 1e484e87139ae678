"""What the zoo builds: tasks, variants and the training recipes of each build profile.

Torch-free, so the cache can validate a profile name and list model names cheaply. Every
card carries :func:`recipe_fingerprint` of its architecture and recipe, so editing either
here rebuilds that model on the next ``ensure_zoo``; bump ``MODEL_VERSION`` for changes the
fingerprint cannot see (the training or export code).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tierlink.errors import ZooError

MODEL_VERSION = "1"
TASKS = ("fmnist",)
# Variant -> the tier it is meant for.
VARIANT_TIERS: Mapping[str, str] = MappingProxyType(
    {"small": "device", "medium": "edge", "large": "cloud"})


@dataclass(frozen=True, slots=True)
class NetSpec:
    """Architecture of one variant (built by ``tierlink.zoo.nets.build_net``).

    ``stages``: conv widths per stage (3x3 conv + BatchNorm + ReLU each); every stage but
    the last ends in a 2x2 max-pool, so three stages run at 28x28, 14x14 and 7x7.
    ``head``: ``"gap"`` (global average pool -> linear) or ``"flatten"`` (2x2 max-pool to
    3x3, flatten [-> ``hidden`` units when non-zero] -> linear).
    """

    stages: tuple[tuple[int, ...], ...]
    head: str = "gap"
    hidden: int = 0
    dropout: float = 0.0


# Chosen by measurement (55k train, test split, this recipe family): the flatten heads keep
# coarse spatial layout, which Fashion-MNIST rewards; compute at 28x28 dominates the cost
# of small nets, so every variant keeps its first stage narrow.
SPECS: Mapping[str, NetSpec] = MappingProxyType({
    # device: 29,178 params, ~1.9M MACs per image.
    "small": NetSpec(stages=((16,), (32,), (64,)), head="flatten"),
    # edge: 145,082 params, ~5.6M MACs per image.
    "medium": NetSpec(stages=((16,), (32, 32), (64, 64)), head="flatten", hidden=128,
                      dropout=0.1),
    # cloud: 575,850 params, ~22M MACs per image (VGG style, dense head).
    "large": NetSpec(stages=((32,), (64, 64), (128, 128)), head="flatten", hidden=256,
                     dropout=0.1),
})


@dataclass(frozen=True, slots=True)
class TrainRecipe:
    """SGD with Nesterov momentum under a one-cycle learning-rate schedule."""

    epochs: int
    max_lr: float = 0.1
    weight_decay: float = 5e-4
    batch_size: int = 128
    flips: bool = False  # random horizontal flips (clothes are left-right symmetric)


@dataclass(frozen=True, slots=True)
class BuildProfile:
    """How thoroughly to build.

    ``train_samples``: train on this prefix of the train split, None = all 55k.
    ``eval_samples``: measure calibration and test accuracy on this prefix of each split,
    None = all. ``latency_runs``: one-image calls timed per model.
    """

    name: str
    recipes: Mapping[str, TrainRecipe]
    train_samples: int | None = None
    eval_samples: int | None = None
    latency_runs: int = 300
    threads: int = 2
    seed: int = 0


PROFILES: Mapping[str, BuildProfile] = MappingProxyType({
    # The real models: about 8 minutes on two free cores, mostly the large one (14.5 min on
    # a shared machine). Test accuracy of the reference build: small 91.37%, medium 91.95%,
    # large 93.58% (it reached 93.74% with 8 epochs; 5 epochs with dropout 0.3: 92.90%).
    "full": BuildProfile(
        name="full",
        recipes=MappingProxyType({
            "small": TrainRecipe(epochs=3),
            "medium": TrainRecipe(epochs=3),
            "large": TrainRecipe(epochs=7, flips=True),
        }),
    ),
    # Same architectures, a fraction of an epoch on a subset: well under a minute, for CI.
    # One thread: tests run beside other work, and two torch threads then collapse.
    "test": BuildProfile(
        name="test",
        recipes=MappingProxyType({
            variant: TrainRecipe(epochs=1, max_lr=0.2, batch_size=64)
            for variant in VARIANT_TIERS
        }),
        train_samples=2048,
        eval_samples=1000,
        latency_runs=50,
        threads=1,
    ),
})


def get_profile(name: str) -> BuildProfile:
    profile = PROFILES.get(name)
    if profile is None:
        raise ZooError(f"unknown zoo profile {name!r}; expected one of {sorted(PROFILES)}",
                       hint="use 'full' for the real models or 'test' for the quick CI build")
    return profile


def model_names(task: str) -> tuple[str, ...]:
    """The zoo's model names for ``task``, smallest first: ``fmnist-small`` ..."""
    if task not in TASKS:
        raise ZooError(f"the zoo has no task {task!r}; it knows {list(TASKS)}",
                       hint="use task 'fmnist' (Fashion-MNIST)")
    return tuple(f"{task}-{variant}" for variant in VARIANT_TIERS)


def recipe_fingerprint(profile: BuildProfile, variant: str) -> str:
    """A short hash of everything that determines ``variant``'s weights and measured card
    in ``profile``: a cached model whose card carries another fingerprint is rebuilt."""
    text = repr((MODEL_VERSION, SPECS[variant], profile.recipes[variant],
                 profile.train_samples, profile.eval_samples, profile.seed))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
