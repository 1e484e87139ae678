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

from tierlink.errors import ModelError

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
