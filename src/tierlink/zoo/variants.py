"""Quantized variants of the zoo's models, made on first use where a fleet or command
names one (``fmnist-small-fp16``): the zoo's directory, data and build lock around
:func:`tierlink.quantize.variants.make_variant_at`."""

from __future__ import annotations

from collections.abc import Iterable

from tierlink.core.progress import Reporter, as_reporter
from tierlink.models.card import ModelCard
from tierlink.quantize.settings import QuantSettings
from tierlink.quantize.variants import EvalData, Say, make_variant_at, split_variant_name
from tierlink.zoo.cache import Zoo, build_lock, load_zoo


def _quiet(_: str) -> None:
    pass


def eval_data(zoo: Zoo) -> EvalData:
    """The zoo task's calibration and test splits, as many images as the profile
    evaluates (the ``test`` profile: a prefix, to stay fast)."""
    from tierlink.zoo.datasets import load_splits
    from tierlink.zoo.profiles import get_profile

    splits = load_splits(zoo.task)
    n = get_profile(zoo.profile).eval_samples
    return EvalData(splits.calib.head(n or len(splits.calib)),
                    splits.test.head(n or len(splits.test)))


def make_variant(zoo: Zoo, parent: str, settings: QuantSettings, *,
                 data: EvalData | None = None, say: Say | None = None,
                 latency_rounds: int = 30) -> ModelCard:
    """Make ``parent`` at ``settings`` into the zoo directory (replacing any older one)
    and return its card. Holds the zoo's build lock. Seconds for ``int8-static``; a
    ``mixed`` search quantizes the model once per layer and more (under a minute here)."""
    with build_lock(zoo.root, zoo.task):
        return make_variant_at(zoo.root, zoo.card(parent), zoo.path(parent), settings,
                               data or eval_data(zoo), say or _quiet, latency_rounds)


def ensure_variant(zoo: Zoo, name: str, *, data: EvalData | None = None,
                   say: Say | None = None, latency_rounds: int = 30) -> ModelCard:
    """The card of model ``name`` (a base model or a variant such as
    ``fmnist-small-int8``), making the variant with default settings when it is missing
    or stale. Cheap when valid: no lock, no ONNX work. ``load_zoo`` again to see it."""
    if name in zoo.cards:
        return zoo.cards[name]
    parent, precision = split_variant_name(name, zoo.base_names())
    with build_lock(zoo.root, zoo.task):
        fresh = load_zoo(zoo.task, zoo.profile, zoo.root)  # another process may have made it
        if name in fresh.cards:
            return fresh.cards[name]
        return make_variant_at(fresh.root, fresh.card(parent), fresh.path(parent),
                               QuantSettings(precision=precision), data or eval_data(fresh),
                               say or _quiet, latency_rounds)


def with_variants(zoo: Zoo, names: Iterable[str], say: Say | None = None,
                  progress: bool | Reporter = False) -> Zoo:
    """``zoo`` with every variant among ``names`` made if missing (base models and names
    already present pass through), each a phase of ``progress``; the zoo reloaded when
    anything was made."""
    missing = [n for n in names if n not in zoo.cards]
    reporter = as_reporter(progress)
    for name in missing:
        (say or _quiet)(f"making {name} (first use)")
        with reporter.phase(name):  # blocking: its heartbeat says it is still working
            ensure_variant(zoo, name)
    return load_zoo(zoo.task, zoo.profile, zoo.root) if missing else zoo
