"""Make a publishable version out of a model of any source: the card rewritten, the
validation measured.

:func:`prepare_version` copies the card with its ``version`` set to the new version (its
``name`` to the served name, its ``sha256`` to the graph's), hashes both files and builds the
:class:`~tierlink.repo.manifest.VersionManifest` to sign. :func:`measure_validation` runs the
model with the runtime its card names on the test data the catalog has for the card's task,
which is the validation record every version carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tierlink.errors import ConfigError, ModelError
from tierlink.models.card import ModelCard, load_card, save_card
from tierlink.models.package import PACKAGE
from tierlink.repo.manifest import NAME_PATTERN, Validation, VersionManifest, is_safe_name
from tierlink.repo.verify import hash_file

Clock = Callable[[], float]
Progress = Callable[[int, int], None]  # (images done, images in all)
EVAL_BATCH = 1000


def prepare_version(name: str, onnx_path: Path | str, card_path: Path | str, version: str,
                    notes: str, out_dir: Path | str, validation: Validation, *,
                    clock: Clock = time.time) -> tuple[VersionManifest, Path, Path]:
    """The manifest of ``onnx_path`` + a copy of ``card_path`` (written into ``out_dir`` with
    ``version``, ``name`` and ``sha256`` set; a multi-exit model's segments packed into one
file, ``model.zip``, which the card then names) as version
    ``version`` of model ``name``. Returns ``(manifest, onnx_path, the new card's path)``;
    the graph itself is not copied. :class:`ConfigError` for a bad name, version or card."""
    for field, value in (("model name", name), ("--version", version)):
        if not is_safe_name(value):
            raise ConfigError(f"{field} {value!r} does not match {NAME_PATTERN}",
                              hint="use letters, digits, '.', '_' and '-'")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    card = _read_card(card_path)
    onnx = Path(onnx_path)
    if card.format == "multi-exit":  # its segments travel as one file
        from tierlink.models.exits import pack_exits

        onnx = out / PACKAGE
        pack_exits(Path(card_path), onnx)
        card = replace(card, file=PACKAGE)
    onnx_sha, onnx_size = hash_file(onnx)
    card = replace(card, name=name, version=version, sha256=onnx_sha)
    new_card = out / f"{name}-{version}.json"
    save_card(card, new_card)
    card_sha, card_size = hash_file(new_card)
    manifest = VersionManifest(name=name, task=card.task, version=version,
                               onnx_sha256=onnx_sha, onnx_size=onnx_size,
                               card_sha256=card_sha, card_size=card_size, notes=notes,
                               validation=validation, created_at=clock())
    return manifest, onnx, new_card


def measure_validation(onnx_path: Path | str, card_path: Path | str,
                       limit: int | None = None, *, progress: Progress | None = None,
                       clock: Clock = time.time) -> Validation:
    """The model's task metric (top-1 accuracy for a classifier) on the first ``limit``
    (default: all) samples of the test split of the card's task, as the catalog finds it;
    the model run by the runtime its card's format names (an ONNX graph, a user's Python
    model ...), one thread, in batches of :data:`EVAL_BATCH` (``progress`` after each)."""
    import numpy as np

    from tierlink.models import runtimes
    from tierlink.models.catalog import Catalog
    from tierlink.models.evaluate import feed
    from tierlink.models.kind_registry import kind_of
    from tierlink.models.runtime import MAX_BATCH
    from tierlink.models.runtimes import LoadSpec

    task = _read_card(card_path).task
    if limit is not None and limit < 1:
        raise ConfigError(f"--eval-limit must be >= 1, got {limit}",
                          hint="omit it to evaluate the whole test split")
    test = Catalog.default().data(task).test
    test = test.head(limit) if limit is not None else test
    rt = runtimes.load(LoadSpec(card=Path(card_path), model_file=Path(onnx_path)))
    spec = rt.info.spec_for(rt.outputs)
    chunks: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(test), EVAL_BATCH):
        for sub in range(start, min(start + EVAL_BATCH, len(test)), MAX_BATCH):
            part = test.take(np.arange(sub, min(sub + MAX_BATCH, start + EVAL_BATCH,
                                                len(test))))
            for name, value in rt.infer(feed(part.inputs, rt.inputs)).items():
                chunks.setdefault(name, []).append(np.asarray(value))
        if progress is not None:
            progress(min(start + EVAL_BATCH, len(test)), len(test))
    raw = {name: np.concatenate(parts) for name, parts in chunks.items()}
    kind = kind_of(spec.kind)
    score = kind.score(kind.answer(raw, spec, rt.info.temperature), test.labels, spec)
    return Validation(dataset=task, split="test", n=len(test),
                      accuracy=float(score or 0.0), measured_at=clock())


def _read_card(path: Path | str) -> ModelCard:
    try:
        return load_card(Path(path))
    except ModelError as exc:
        raise ConfigError(exc.message, hint="pass the card.json beside the model file with "
                                            "--card (tierlink model catalog lists models)") \
            from exc
