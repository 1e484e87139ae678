"""ONNX Runtime sessions as every part of tierlink opens them (the zoo, split heads and tails,
quantisation, the repository's checks): CPU, a fixed number of intra-op threads, no
spinning — spinning threads of several sessions starve each other on a small machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tierlink.errors import ZooError

__all__ = ["ort_session"]


def ort_session(path: Path | str, threads: int = 1) -> Any:
    """A CPU session of the model at ``path``; ``ZooError`` naming it when it cannot load."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise ZooError(f"cannot load ONNX model {path}: {exc}") from exc
