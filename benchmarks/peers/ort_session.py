"""One ONNX Runtime session opened exactly as a tierlink node opens it (``OnnxModel`` in
``src/tierlink/models/onnx.py``): ``threads`` intra-op threads, one inter-op thread, no
spinning, the CPU provider, ONNX Runtime's default graph optimisations.

The peer runtimes (``mlserver_onnx.py``, ``kserve_onnx.py``) run in their servers' own
virtualenvs, where tierlink is not installed, so the options are restated here;
``tests/benchmarks/test_peers.py`` checks they stay equal to the node's.
"""

from __future__ import annotations

from typing import Any


def open_session(path: str, threads: int = 1) -> Any:
    """An ``onnxruntime.InferenceSession`` for the model at ``path``."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
