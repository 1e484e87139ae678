"""What each model answers, input by input: the simulator's stand-in for running a model.

Every model of a task is run once over the task's test split (the inputs the demo draws
its requests from) and its answer and calibrated confidence kept per input, so a simulated
cascade meets the models' real joint behaviour — an input the device model is unsure of is
the same input the edge model then sees — not a guessed escalation rate. Computed once per
set of model files (keyed by their sha256) and cached under ``$TIERLINK_HOME/sim``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tierlink.core.progress import Reporter, as_reporter
from tierlink.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Answers:
    """One model's answer (top-1 class) and calibrated confidence on each input."""

    pred: np.ndarray  # (N,) int
    confidence: np.ndarray  # (N,) float


@dataclass(frozen=True, slots=True)
class Outcomes:
    """A task's labelled inputs and every model's answers on them."""

    task: str
    labels: np.ndarray  # (N,)
    models: Mapping[str, Answers]
    input_bytes: int  # one input on the wire (FP32)

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def answer(self, model: str, sample: int) -> tuple[int, float]:
        found = self.models.get(model)
        if found is None:
            raise ConfigError(f"the simulation has no answers of model {model!r} on task "
                              f"{self.task!r}", hint=f"models: {sorted(self.models)}")
        return int(found.pred[sample]), float(found.confidence[sample])


def model_outcomes(task: str, names: Iterable[str], profile: str = "full",
                   cache_dir: Path | None = None,
                   progress: bool | Reporter = False) -> Outcomes:
    """Answers of the classifiers ``names`` of ``task`` on its test split, each found by
    the catalog (zoo variants made on first use, as the demo makes them); computed once
    (cached), a phase of ``progress`` (a reporter) then."""
    from tierlink.models.card import load_card
    from tierlink.models.catalog import Catalog, SourceOptions

    wanted = sorted(set(names))
    catalog = Catalog.default(SourceOptions(profile=profile, progress=False))
    found = catalog.resolve(wanted)
    cards = {n: load_card(found[n].card) for n in wanted}
    test = catalog.data(task).test
    shas = [cards[n].sha256 for n in wanted]
    key = hashlib.sha256(("|".join(f"{n}={s}" for n, s in zip(wanted, shas, strict=True))
                          + f"|{task}|{test.labels.shape[0]}").encode()).hexdigest()[:16]
    path = (cache_dir or _cache_dir()) / f"outcomes-{task}-{key}.npz"
    input_bytes = int(np.prod(test.input.shape[1:])) * 4
    if path.is_file():
        return _load(path, task, wanted, input_bytes)
    from tierlink.models.evaluate import onnx_logits, softmax

    models = {}
    with as_reporter(progress).phase("recorded answers", len(wanted), heartbeat=True) as phase:
        for name in wanted:
            phase.stage(f"{name} on {test.labels.shape[0]:,} test images")
            probs = softmax(onnx_logits(found[name].file, test.input, threads=1),
                            cards[name].temperature)
            models[name] = Answers(probs.argmax(axis=1).astype(np.int16),
                                   probs.max(axis=1).astype(np.float32))
            phase.advance()
    outcomes = Outcomes(task, test.labels.astype(np.int16), models, input_bytes)
    _save(path, outcomes)
    return outcomes


def _cache_dir() -> Path:
    from tierlink.models.home import tierlink_home

    return tierlink_home() / "sim"


def _save(path: Path, o: Outcomes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"labels": o.labels}
    for name, a in o.models.items():
        arrays[f"pred:{name}"] = a.pred
        arrays[f"conf:{name}"] = a.confidence
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)  # type: ignore[arg-type]
    tmp.replace(path)


def _load(path: Path, task: str, names: list[str], input_bytes: int) -> Outcomes:
    with np.load(path) as data:
        models = {n: Answers(data[f"pred:{n}"], data[f"conf:{n}"]) for n in names}
        return Outcomes(task, data["labels"], models, input_bytes)


def photo_outcomes(task: str, model: str, reference: np.ndarray, confidence: np.ndarray,
                   input_bytes: int) -> Outcomes:
    """The demo's photo task (its ``PhotoPhase``): the large model's answers on its photos.
    The labels are those answers (the demo scores a split plan by its agreement with the
    unsplit model); a split plan answers as the whole model does (the policy only picks
    codecs that lose at most ``split_max_accuracy_loss``)."""
    answers = Answers(reference.astype(np.int16), confidence.astype(np.float32))
    return Outcomes(task, reference.astype(np.int16), {model: answers}, input_bytes)


def synthetic_outcomes(task: str, skills: Mapping[str, float], n: int, seed: int,
                       input_bytes: int = 3136) -> Outcomes:
    """Answers of models of ``task`` without a zoo: a shared difficulty per input drives
    each model's correctness (``skills``: its accuracy, about) and confidence, so cascades
    meet a real joint behaviour (harder inputs are harder for every model)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.int16)
    hard = rng.random(n)
    models = {}
    for name, skill in skills.items():
        right = hard < skill + 0.05 * rng.standard_normal(n)
        pred = np.where(right, labels, (labels + 1) % 10).astype(np.int16)
        conf = np.clip(np.where(right, 0.97, 0.6) - 0.3 * hard * rng.random(n), 0.1, 1.0)
        models[name] = Answers(pred, conf.astype(np.float32))
    return Outcomes(task, labels, models, input_bytes=input_bytes)
