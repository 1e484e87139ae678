"""The photo task's models the zoo can make, with this machine's split profile beside them.

MobileNetV2 (ImageNet weights from a package, exported on first use) is the zoo's photo
model; a node prices split plans of it from a split profile made on this machine (block
cuts ``features.*``, timed once and cached beside the card). The demo, the CLI's ``fleet
up`` and ``benchmarks/split.py`` get both from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from tierlink.core.progress import Reporter

PHOTO_TASK = "imagenet"
# Rounds per segment when a split profile is made on first use: ~11 s for MobileNetV2's 19
# block cuts on one core (what benchmarks/split.py uses too).
PROFILE_ROUNDS = 10
Say = Callable[[str], None]


def photo_models(wanted: Collection[str], say: Say = lambda _: None,
                 progress: bool | Reporter = True) -> dict[str, tuple[Path, Path]]:
    """Model name -> (onnx, card) for the photo-task models among ``wanted`` that the zoo
    can make: MobileNetV2, exported on first use (a phase of ``progress``), with this
    machine's split profile beside its card (made on first use too, so nodes can price
    split plans)."""
    from tierlink.zoo.mobilenet import MODEL_NAME, card_path, ensure_mobilenet

    if MODEL_NAME not in wanted:
        return {}
    onnx_path = ensure_mobilenet(progress=progress)
    ensure_split_profile(MODEL_NAME, onnx_path, say)
    return {MODEL_NAME: (onnx_path, card_path(onnx_path))}


def ensure_split_profile(name: str, onnx_path: Path, say: Say = lambda _: None) -> Path:
    """The split profile beside ``onnx_path``'s card, made (block cuts ``features.*``,
    :data:`PROFILE_ROUNDS` rounds) when missing, made for another file, or without codec
    measurements. Holds the zoo's build lock, so concurrent callers profile once."""
    from tierlink.models.card import load_card
    from tierlink.models.split_profile import load_profile, profile_path
    from tierlink.zoo.cache import build_lock
    from tierlink.zoo.mobilenet import card_path

    card = load_card(card_path(onnx_path))
    path = profile_path(card_path(onnx_path))
    if _profile_ok(load_profile(path, card.sha256)):
        return path
    with build_lock(onnx_path.parent, PHOTO_TASK):
        if not _profile_ok(load_profile(path, card.sha256)):
            _make_profile(name, onnx_path, card.sha256, path, say)
    return path


def _profile_ok(profile: Any) -> bool:
    return profile is not None and all(p.codecs for p in profile.points)


def _make_profile(name: str, onnx_path: Path, sha256: str, path: Path, say: Say) -> None:
    from tierlink.models.split_profile import save_profile
    from tierlink.split.profile import profile_model
    from tierlink.zoo.photos import imagenet_photos

    say(f"profiling {name}'s block cuts on this machine for split plans (once, ~10 s) ...")
    start = time.perf_counter()
    photos, _ = imagenet_photos(views=False)
    profile = profile_model(name, onnx_path, photos[:1], sha256, rounds=PROFILE_ROUNDS,
                            only=lambda tensor: tensor.startswith("features."))
    save_profile(profile, path)
    say(f"split profile of {name}: {len(profile.points)} cuts in "
        f"{time.perf_counter() - start:.1f} s")


__all__ = ["PHOTO_TASK", "PROFILE_ROUNDS", "ensure_split_profile", "photo_models"]
