"""ONNX Runtime sessions as every part of tierlink opens them: an ordered list of execution
providers with fallback, a fixed number of intra-op threads, no spinning.

A node's spec (or ``model import --providers``) names the providers it wants in order, e.g.
``[CUDAExecutionProvider, CPUExecutionProvider]``. :func:`open_session` skips those this
ONNX Runtime build does not have and those whose session fails to open (a CUDA build without
a GPU), each with a logged reason, and reports which provider runs the model. CPU is always
the last resort, so a model opens wherever ONNX Runtime does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import ModelError, RuntimeFailure
from tierlink.models.runtime import ModelInfo, validate_inputs
from tierlink.models.split_profile import profile_path
from tierlink.models.tensors import from_ort

CPU = "CPUExecutionProvider"
DEFAULT_PROVIDERS: tuple[str, ...] = (CPU,)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OpenedSession:
    session: Any
    provider: str  # the provider that runs the model
    skipped: tuple[str, ...]  # "PROVIDER: why" for each one passed over


def session_options(threads: int = 1) -> Any:
    """One intra-op thread by default and no spinning: several sessions share few cores,
    and spinning threads starve each other."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return opts


def open_session(path: Path | str, providers: Sequence[str] = DEFAULT_PROVIDERS,
                 threads: int = 1) -> OpenedSession:
    """The first provider of ``providers`` (then CPU) that opens ``path``."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    skipped: list[str] = []
    wanted = list(dict.fromkeys([*providers, CPU]))
    last: Exception | None = None
    for provider in wanted:
        if provider not in available:
            skipped.append(f"{provider}: not in this onnxruntime build")
            continue
        try:
            session = ort.InferenceSession(str(path), session_options(threads),
                                           providers=[provider])
        except Exception as exc:  # noqa: BLE001 (onnxruntime raises its own untyped errors)
            skipped.append(f"{provider}: {str(exc).splitlines()[0][:200]}")
            last = exc
            continue
        for why in skipped:
            log.warning("%s: skipped %s", Path(path).name, why)
        return OpenedSession(session, provider, tuple(skipped))
    raise ModelError(f"cannot load ONNX model {path}: {last}" if last else
                   f"cannot load ONNX model {path}: no provider of {wanted} is available")


def parse_providers(raw: Any, where: str) -> tuple[str, ...]:
    """A provider list from a spec or flag: names, short forms allowed (``cuda`` ->
    ``CUDAExecutionProvider``)."""
    from tierlink.errors import ConfigError

    if raw is None:
        return DEFAULT_PROVIDERS
    if isinstance(raw, str):
        raw = [p for p in raw.split(",") if p.strip()]
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(f"{where} must be a list of execution providers, e.g. [cuda, cpu]")
    return tuple(_full_name(str(p).strip()) for p in raw)


def _full_name(name: str) -> str:
    if name.endswith("ExecutionProvider"):
        return name
    short = {"cpu": "CPU", "cuda": "CUDA", "tensorrt": "Tensorrt", "openvino": "OpenVINO",
             "dml": "Dml", "coreml": "CoreML", "rocm": "ROCM", "migraphx": "MIGraphX"}
    return f"{short.get(name.lower(), name)}ExecutionProvider"


def ort_session(path: Path | str, threads: int = 1) -> Any:
    """A CPU session of the model at ``path`` (what the zoo, split heads and tails,
    quantisation and the repository's checks run); ``ModelError`` naming it when it cannot
    load."""
    return open_session(path, (CPU,), threads).session


class OnnxModel:
    """An ONNX model in ONNX Runtime: one session, one intra-op thread, no spinning (several
    sessions share two cores, and spinning threads starve each other)."""

    platform = "onnxruntime_onnx"

    def __init__(self, path: Path, info: ModelInfo, threads: int = 1,
                 providers: tuple[str, ...] = DEFAULT_PROVIDERS) -> None:
        opened = open_session(path, providers, threads)
        self._session = opened.session
        self.provider = opened.provider  # the execution provider that runs it
        self.skipped_providers = opened.skipped  # "PROVIDER: why" for those passed over
        self.path = Path(path)
        self.info = info.on_provider(opened.provider)
        self.inputs = tuple(from_ort(i) for i in self._session.get_inputs())
        self.outputs = tuple(from_ort(o) for o in self._session.get_outputs())

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = validate_inputs(self.info.name, self.inputs, inputs)
        try:
            values = self._session.run(None, feed)
        except Exception as exc:  # map onnxruntime's errors at this boundary
            raise RuntimeFailure(f"{self.info.name} failed: {exc}") from exc
        return {spec.name: np.asarray(v) for spec, v in zip(self.outputs, values, strict=True)}


def load_onnx(spec: Any) -> OnnxModel:
    """The ``onnx`` format's runtime factory (:mod:`tierlink.models.runtimes`): the graph is
    the spec's model file, else the one its card names beside it (``model.onnx``)."""
    card = spec.read_card()
    path = spec.model_file or spec.directory / card.file
    return OnnxModel(path, ModelInfo.of(card, profile_path(spec.card)), threads=spec.threads,
                     providers=spec.providers)
