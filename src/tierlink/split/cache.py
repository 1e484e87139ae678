"""Head and tail files of a model, cut once per machine and kept beside the model.

Cutting MobileNetV2 at one block is 0.15-0.2 s of Python (onnx protobuf work that holds the
GIL), several times that under a device's CPU quota: done while a node serves, it stalls
every request the node is handling (a demo photo missed its deadline behind it). So cut
files live in ``<model dir>/.<model>.splits/<key>/`` — ``key`` from the model file's size and
modification time, so a replaced model gets new cuts — and are made once: by the split
profiler, which cuts every block anyway, or by the first node that opens the cut. Opening a
cut is then only the ONNX Runtime sessions. Files are written under a temporary name and
renamed into place, so two nodes cutting the same model at once both end with whole files.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path


def split_dir(model_path: Path) -> Path:
    """Where the cuts of ``model_path`` (as it is now) are kept."""
    st = Path(model_path).stat()
    return Path(model_path).parent / f".{Path(model_path).stem}.splits" / \
        f"{st.st_size}-{st.st_mtime_ns}"


def cached_split(model_path: Path, tensor: str,
                 fallback_dir: Path | None = None) -> tuple[Path, Path]:
    """The head and tail files of ``model_path`` cut at ``tensor``, made if missing. Where
    the model's directory is not writable, they are made under ``fallback_dir``."""
    try:
        return _made(split_dir(model_path), model_path, tensor)
    except PermissionError:
        if fallback_dir is None:
            raise
        return _made(Path(fallback_dir), model_path, tensor)


def _made(directory: Path, model_path: Path, tensor: str) -> tuple[Path, Path]:
    from tierlink.split.partition import split_model

    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", tensor)
    head, tail = directory / f"{stem}.head.onnx", directory / f"{stem}.tail.onnx"
    if head.exists() and tail.exists():
        return head, tail
    directory.mkdir(parents=True, exist_ok=True)
    tmp = f".tmp-{os.getpid()}"
    tmp_head, tmp_tail = head.with_name(head.name + tmp), tail.with_name(tail.name + tmp)
    try:
        split_model(model_path, tensor, tmp_head, tmp_tail)
        os.replace(tmp_tail, tail)  # the tail first: a head is only taken with its tail
        os.replace(tmp_head, head)
    finally:
        tmp_head.unlink(missing_ok=True)
        tmp_tail.unlink(missing_ok=True)
    return head, tail


def cached_cuts(model_path: Path) -> frozenset[str]:
    """The tensors ``model_path`` may be cut at (after its input), found once per machine:
    finding them parses the whole graph (~0.14 s of Python for MobileNetV2)."""
    from tierlink.split.partition import cut_points

    directory = split_dir(model_path)
    path = directory / "cuts.json"
    try:
        return frozenset(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass
    cuts = sorted(c.tensor for c in cut_points(model_path) if c.index > 0)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"cuts.json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(cuts))
        os.replace(tmp, path)
    except OSError:
        pass  # not writable: found again next time
    return frozenset(cuts)
