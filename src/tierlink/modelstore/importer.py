"""``tierlink model import``: measure a user's model — an ONNX graph, a Python class
(:mod:`tierlink.models.python`), or a file of any format an installed runtime serves
(:mod:`tierlink.models.runtimes`) — on its own labelled data, write its card, install it in
the model store. All are measured through the same calls (:func:`~tierlink.models.evaluate.
predictor`), so their cards mean the same and they cascade with each other. A runtime
package's model is opened through its runtime exactly as a node will open it: from a draft
card beside its file.

The task decides what the model must look like: the first import of a task declares it
(inputs from the model's signature, the output kind and roles from the flags) unless a
declaration is given (a fleet file's ``tasks:``); every later model of the task must take
the same inputs and give outputs its kind can read. Everything is checked before anything
is written, and the install is atomic (``ModelStore.installing``).
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from tierlink.errors import (
    ConfigError,
    ImportRefused,
    ModelError,
    RuntimeFailure,
    TensorError,
    TierlinkError,
)
from tierlink.models.calibration import calibration_error, kind_temperature
from tierlink.models.card import ModelCard, save_card
from tierlink.models.card_parts import Calibration, DataInfo
from tierlink.models.data import Labelled, Splits, load_data, split
from tierlink.models.evaluate import (
    FINE_THRESHOLDS,
    Predict,
    cascade_points,
    feed,
    latency,
    predictor,
    run,
    signature,
)
from tierlink.models.kind_registry import kind_of
from tierlink.models.kinds import OutputKind, check_kind_outputs
from tierlink.models.layout import CARD_FILE, MODEL_FILE
from tierlink.models.onnx import DEFAULT_PROVIDERS, open_session
from tierlink.models.package import PACKAGE, unpack
from tierlink.models.python import DEFAULT_ENTRY, FORMAT, PythonModel, pack
from tierlink.models.runtime import ModelInfo, ModelRuntime
from tierlink.models.runtimes import LoadSpec
from tierlink.models.runtimes import load as load_runtime
from tierlink.models.runtimes import registry as runtime_registry
from tierlink.models.task import TaskSpec, same_inputs
from tierlink.models.tensors import TensorDecl, datatype_of
from tierlink.modelstore.store import ModelStore

TIERS = ("device", "edge", "cloud")
NOT_IMPORTED = ("llm", "gguf")  # formats a fleet file names directly (``llms:``), never imported
LABELS_HINT = ("y holds one target per sample: a class id (classification), 0/1 per label "
               "(multilabel), boxes (N, G, 5) padded with class -1 (detection), values "
               "(regression), class ids (embedding)")


@dataclass(frozen=True, slots=True)
class ImportRequest:
    name: str
    model: Path  # an .onnx file; or a Python model's source (.py file, or directory)
    task: str
    tier: str
    data: Path
    kind: str | None = None  # for a task declared by this import (default classification)
    declared: TaskSpec | None = None  # the task as a fleet file declares it
    outputs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    labels: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    calib_share: float = 0.5
    seed: int = 0
    providers: tuple[str, ...] = DEFAULT_PROVIDERS
    version: str = "1"
    entry: str = DEFAULT_ENTRY  # a Python model's class, "module:Class"
    # Any format an installed runtime serves; by default an .onnx file is onnx, else python.
    model_format: str | None = None

    @property
    def fmt(self) -> str:
        if self.model_format is not None:
            return self.model_format
        return "onnx" if Path(self.model).suffix == ".onnx" else FORMAT


@dataclass(frozen=True, slots=True)
class _Opened:
    """The model being imported, opened to be measured: one call, its signature, who runs
    it, and the one file that is installed (the graph, or the Python model's package)."""

    predict: Predict
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    provider: str
    file: Path


def import_model(req: ImportRequest, store: ModelStore,
                 say: Callable[[str], None] = lambda m: None) -> ModelCard:
    """Measure, then install; returns the card. Raises ``ImportRefused`` naming the problem
    (nothing is written then)."""
    t0 = time.perf_counter()
    _check_request(req)
    if req.fmt == "multi-exit":
        from tierlink.modelstore.import_exits import import_exits

        card = import_exits(req, store, say)
        say(f"{req.name} imported in {time.perf_counter() - t0:.1f} s")
        return card
    with tempfile.TemporaryDirectory(prefix="tierlink-import-") as tmp:
        opened = _open(req, store, Path(tmp))
        task = resolve_task(req, store, opened.inputs)
        try:
            kind = kind_of(task.kind)
        except ConfigError as exc:
            raise ImportRefused(exc.message, hint=exc.hint) from exc
        check_inputs(task, opened.inputs, req.name)
        say(f"reading {req.data}")
        data = load_data(req.data, [i.name for i in opened.inputs], task.labels)
        if not opened.outputs:  # a Python model's outputs (or a runtime's): what it answers
            opened = _with_outputs(opened, data)
        check_outputs(task, kind, opened.outputs)
        parts = split(data, req.calib_share, req.seed)
        say(f"running {req.name} on {len(parts.calib)} calibration + {len(parts.test)} "
            "evaluation samples")
        figures = _figures(opened.predict, kind, task, parts, opened.inputs)
        say("timing it")
        timings = {opened.provider: latency(opened.predict,
                                            feed(parts.test.inputs, opened.inputs))}
        if req.fmt == "onnx":
            timings |= _other_providers(req, opened.provider, parts, opened.inputs)
        card = _card(req, task, opened, figures, timings, parts)
        install(store, card, task, data, opened.file)
    say(f"{req.name} imported in {time.perf_counter() - t0:.1f} s")
    return card


def _check_request(req: ImportRequest) -> None:
    if req.tier not in TIERS:
        raise ImportRefused(f"--tier {req.tier!r}: one of {', '.join(TIERS)}")
    formats = importable_formats()
    if req.fmt not in formats:
        raise ImportRefused(f"--format {req.fmt!r}: no installed runtime imports it; one of "
                            f"{', '.join(formats)}", hint="a package adds a format under the "
                            "'tierlink.runtimes' entry points")
    if not Path(req.model).exists():
        raise ImportRefused(f"{req.model} does not exist")


def importable_formats() -> list[str]:
    """The formats ``tierlink model import --format`` takes: every installed runtime's."""
    return [f for f in runtime_registry().names() if f not in NOT_IMPORTED]


def _open(req: ImportRequest, store: ModelStore, tmp: Path) -> _Opened:
    if req.fmt == "onnx":
        return _open_onnx(req.model, req.providers)
    if req.fmt == FORMAT:
        return _open_python(req, store, tmp)
    return _open_runtime(req, store, tmp)


def _open_onnx(path: Path, providers: tuple[str, ...]) -> _Opened:
    try:
        opened = open_session(path, providers)
    except ModelError as exc:
        raise ImportRefused(f"{path} is not an ONNX model ONNX Runtime can load: "
                            f"{exc.message[:300]}", hint="export it with torch.onnx.export, "
                            "tf2onnx or skl2onnx and check it with onnx.checker; a Python "
                            "model is imported from its .py file or directory") from exc
    inputs, outputs = signature(opened.session)
    return _Opened(predictor(opened.session), inputs, outputs, opened.provider, Path(path))


def _open_python(req: ImportRequest, store: ModelStore, tmp: Path) -> _Opened:
    """Pack the source as the model's one file, load the class from it as a node will;
    its inputs are what the class declares, else what the task takes."""
    package = tmp / PACKAGE
    pack(req.model, package)
    task = req.declared or store.task(req.task)
    info = ModelInfo(req.name, req.task, req.version)
    try:
        model = PythonModel(unpack(package), req.entry, info,
                            inputs=() if task is None else task.inputs)
    except (ModelError, ConfigError) as exc:
        raise ImportRefused(f"{req.model}: {exc.message}", hint=exc.hint) from exc
    if not model.inputs:
        raise ImportRefused(f"{req.entry} declares no inputs and task {req.task!r} is not "
                            "declared yet", hint="give the class an inputs attribute "
                            "([{name, datatype, shape}]), or declare the task in a fleet "
                            "file's tasks: and pass --fleet")
    return _Opened(model.predict, model.inputs, (), "python", package)


def _open_runtime(req: ImportRequest, store: ModelStore, tmp: Path) -> _Opened:
    """A model of a runtime package's format: its one file copied as the card will name it
    (``model`` and the source's suffixes), a draft card beside it, opened through that
    runtime's factory as a node opens it. Its inputs are what the runtime reads off the
    file, else what the task takes."""
    source = Path(req.model)
    if not source.is_file():
        raise ImportRefused(f"{source}: a {req.fmt} model is imported from one file")
    file = tmp / f"model{''.join(source.suffixes)}"
    shutil.copyfile(source, file)
    task = req.declared or store.task(req.task)
    draft = ModelCard(name=req.name, task=req.task, version=req.version, format=req.fmt,
                      file=file.name, sha256=hashlib.sha256(file.read_bytes()).hexdigest(),
                      size_bytes=file.stat().st_size, tier=req.tier,
                      inputs=task.inputs if task else (), task_spec=task)
    save_card(draft, tmp / CARD_FILE)
    try:
        runtime = load_runtime(LoadSpec(tmp / CARD_FILE, file, req.providers), req.fmt)
    except TierlinkError as exc:
        raise ImportRefused(f"{source}: {exc.message}", hint=exc.hint) from exc
    except Exception as exc:
        raise ImportRefused(f"the {req.fmt!r} runtime cannot load {source}: "
                            f"{type(exc).__name__}: {exc}") from exc
    inputs = tuple(runtime.inputs) or (task.inputs if task else ())
    if not inputs:
        raise ImportRefused(f"the {req.fmt!r} runtime reads no inputs off {source} and task "
                            f"{req.task!r} is not declared yet", hint="declare the task in a "
                            "fleet file's tasks: and pass --fleet")
    provider = str(getattr(runtime, "provider", "") or runtime.platform)
    return _Opened(_guarded(runtime, req.name), inputs, tuple(runtime.outputs), provider, file)


def _guarded(runtime: ModelRuntime, name: str) -> Predict:
    """``runtime.infer``, a failure inside it named as the model's (``RuntimeFailure``)."""
    def predict(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return runtime.infer(feed)
        except TierlinkError:
            raise
        except Exception as exc:
            raise RuntimeFailure(f"{name} failed: {type(exc).__name__}: {exc}") from exc
    return predict


def _with_outputs(opened: _Opened, data: Labelled) -> _Opened:
    """The outputs a model gives when its runtime declares none (a Python model's), read off
    its answer to two samples (the batch dimension any size)."""
    sample = feed(data.head(2).inputs, opened.inputs)
    try:
        answer = opened.predict(sample)
        outputs = tuple(TensorDecl(str(k), datatype_of(np.asarray(v).dtype),
                                   (-1, *np.asarray(v).shape[1:])) for k, v in answer.items())
    except (RuntimeFailure, ConfigError) as exc:
        raise ImportRefused(f"the model fails on the data: {exc.message}", hint=exc.hint) \
            from exc
    if not outputs:
        raise ImportRefused("the model's predict() answers no outputs")
    return replace(opened, outputs=outputs)


def resolve_task(req: ImportRequest, store: ModelStore, inputs: tuple[TensorDecl, ...]) -> TaskSpec:
    known = store.task(req.task)
    declared = req.declared
    if declared is not None and known is not None and not same_inputs(declared, known):
        raise ImportRefused(f"task {req.task!r} is declared with inputs "
                            f"{_inputs(declared)} but the store's models take {_inputs(known)}")
    task = declared or known
    if task is None:
        return TaskSpec(req.task, req.kind or "classification", inputs,
                        MappingProxyType(dict(req.outputs)), req.labels,
                        MappingProxyType(dict(req.options)))
    if req.kind and req.kind != task.kind:
        raise ImportRefused(f"task {req.task!r} is a {task.kind} task; --kind {req.kind} "
                            "does not match it")
    return task


def check_inputs(task: TaskSpec, inputs: tuple[TensorDecl, ...], name: str) -> None:
    mine = TaskSpec(task.name, task.kind, inputs)
    if not same_inputs(task, mine):
        raise ImportRefused(f"{name} takes {_inputs(mine)}, but task {task.name!r} takes "
                            f"{_inputs(task)}: wrong signature for the task",
                            hint="export the model with the task's input names, datatypes "
                                 "and shapes, or import it under another task")


def check_outputs(task: TaskSpec, kind: OutputKind, outputs: tuple[TensorDecl, ...]) -> None:
    try:
        check_kind_outputs(kind, task, [o.name for o in outputs])
    except ConfigError as exc:
        raise ImportRefused(str(exc.message), hint=exc.hint) from exc


def _figures(predict: Predict, kind: OutputKind, task: TaskSpec, parts: Splits,
             inputs: tuple[TensorDecl, ...]) -> dict[str, Any]:
    raw = {p: run(predict, feed(_part(parts, p).inputs, inputs)) for p in ("calib", "eval")}
    try:
        temperature, nll_before, nll_after = kind_temperature(
            kind, raw["calib"], parts.calib.labels, task)
        answers = {p: kind.answer(raw[p], task, temperature) for p in raw}
        score = {p: kind.score(answers[p], _part(parts, p).labels, task) for p in raw}
        correct = kind.correct(answers["calib"], parts.calib.labels, task)
    except TensorError as exc:
        raise ImportRefused(f"the model's outputs or the labels do not fit a {task.kind} "
                            f"task: {exc.message}", hint=LABELS_HINT) from exc
    conf = answers["calib"].confidence
    curve = (cascade_points(conf, correct, FINE_THRESHOLDS)
             if conf is not None and correct is not None else ())
    return {"temperature": temperature, "nll_before": nll_before, "nll_after": nll_after,
            "score": score, "cascade": curve,
            "ece": _eces(kind, task, raw, parts, temperature) if curve else {}}


def _part(parts: Splits, name: str) -> Labelled:
    """A part by the name cards give it: ``calib``, or ``eval`` (the test part)."""
    return parts.calib if name == "calib" else parts.test


def _eces(kind: OutputKind, task: TaskSpec, raw: dict[str, Any], parts: Splits,
          temperature: float) -> dict[str, float]:
    """ECE before and after the temperature, on the calibration part (fitted there) and on
    the evaluation part (a held-out check)."""
    out = {}
    for part, key in (("calib", ""), ("eval", "eval_")):
        y = _part(parts, part).labels
        for t, when in ((1.0, "before"), (temperature, "after")):
            answer = kind.answer(raw[part], task, t)
            out[f"{key}ece_{when}"] = round(calibration_error(
                answer.confidence, kind.correct(answer, y, task)), 6)  # type: ignore[arg-type]
    return out


def _other_providers(req: ImportRequest, first: str, parts: Splits,
                     inputs: tuple[TensorDecl, ...]) -> dict[str, dict[str, float]]:
    """Latency on each further provider of the list that opens here (cards hold latency
    per provider; a node picks the figure of the provider it runs)."""
    out = {}
    for provider in req.providers:
        if provider == first:
            continue
        try:
            other = open_session(req.model, (provider,))
        except ModelError:
            continue
        if other.provider == provider:
            out[provider] = latency(other.session, feed(parts.test.inputs, inputs))
    return out


def _card(req: ImportRequest, task: TaskSpec, opened: _Opened, fig: dict[str, Any],
          timings: dict[str, dict[str, float]], parts: Splits) -> ModelCard:
    blob = opened.file.read_bytes()
    score = fig["score"]
    onnx = req.fmt == "onnx"
    return ModelCard(
        name=req.name, task=task.name, version=req.version, format=req.fmt,
        file=MODEL_FILE if onnx else opened.file.name,
        sha256=hashlib.sha256(blob).hexdigest(), size_bytes=len(blob),
        params=_params(blob) if onnx else 0, tier=req.tier,
        entry=req.entry if req.fmt == FORMAT else "", inputs=opened.inputs,
        outputs=opened.outputs,
        labels=task.labels, task_spec=task, metric=kind_of(task.kind).metric,
        test_accuracy=score["eval"] if score["eval"] is not None else 0.0,
        calib_accuracy=score["calib"] if score["calib"] is not None else 0.0,
        temperature=fig["temperature"], calibration=_calibration(fig, len(parts.calib)),
        cascade=fig["cascade"], latency_ms=MappingProxyType(timings[opened.provider]),
        latency_by_provider=MappingProxyType(
            {k: MappingProxyType(v) for k, v in timings.items()}),
        provider=opened.provider,
        data=DataInfo(parts.calib.sha256, str(req.data), parts.seed, req.calib_share,
                      len(parts.calib), len(parts.test)))


def _calibration(fig: dict[str, Any], samples: int) -> Calibration:
    ece = fig["ece"]
    return Calibration(fig["temperature"], ece.get("ece_before", math.nan),
                       ece.get("ece_after", math.nan), _round(fig["nll_before"]),
                       _round(fig["nll_after"]), ece.get("eval_ece_before", math.nan),
                       ece.get("eval_ece_after", math.nan), samples)


def install(store: ModelStore, card: ModelCard, task: TaskSpec, data: Labelled,
             file: Path) -> None:
    with store.installing(card.name, card.version) as staging:
        shutil.copyfile(file, staging / card.file)
        save_card(card, staging / CARD_FILE)
    # Only once the model is in place: a failed import declares no task.
    store.save_data(data)
    if store.task(task.name) is None:
        store.save_task(task)


def _params(blob: bytes) -> int:
    import onnx

    try:
        model = onnx.load_from_string(blob)
    except Exception:  # noqa: BLE001 (a graph ORT loads but onnx cannot parse: size unknown)
        return 0
    return int(sum(np.prod(t.dims) for t in model.graph.initializer))


def _inputs(task: TaskSpec) -> str:
    return ", ".join(i.describe() for i in task.inputs)


def _round(x: float) -> float:
    return x if math.isnan(x) else round(x, 6)

