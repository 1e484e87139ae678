"""Heads and tails of one model, made on demand and kept: what a node runs for split plans.

A device that may start a split plan holds the model file and runs ``head(cut)``; the
upstream node that serves the model runs ``tail(cut)`` on the decoded features. Segments
come from :func:`tierlink.split.cache.cached_split` (cut once per machine, kept beside the
model; under ``workdir`` where that is not writable), and their ONNX Runtime sessions are
kept for the life of the node. Thread-safe: scheduler workers call it concurrently.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import SplitError


class SplitSessions:
    """Head and tail sessions of the model at ``model_path``, by cut tensor name."""

    def __init__(self, name: str, model_path: Path, workdir: Path) -> None:
        self.name = name
        self.model_path = Path(model_path)
        self.workdir = Path(workdir)
        self._sessions: dict[tuple[str, str], Any] = {}
        self._cuts: frozenset[str] | None = None
        self._lock = threading.Lock()

    def cuts(self) -> frozenset[str]:
        """The tensors this model may be cut at."""
        if self._cuts is None:
            from tierlink.split.cache import cached_cuts

            self._cuts = cached_cuts(self.model_path)
        return self._cuts

    def ready(self, cut: str, part: str = "head") -> bool:
        """Whether the session of ``part`` (head or tail) at ``cut`` is open."""
        return (part, cut) in self._sessions

    def prepare(self, cut: str, part: str = "head") -> None:
        """Open the session of ``part`` at ``cut`` and run it once now (blocking; the cut
        files come from the machine's cache, so this is ONNX Runtime's session: ~20-50 ms
        for MobileNetV2 on a free core): done before the scheduler runs a segment, so the
        time it learns is the segment's, not this one-off cost. A device opens only heads,
        the node that serves the model only tails."""
        self._session(part, cut)

    def head(self, cut: str, x: np.ndarray) -> np.ndarray:
        """Run input -> ``cut`` on ``x`` (N, ...) and return the cut tensor."""
        session = self._session("head", cut)
        return session.run(None, {session.get_inputs()[0].name: x})[0]

    def tail(self, cut: str, features: np.ndarray) -> dict[str, np.ndarray]:
        """Run ``cut`` -> the model's outputs on ``features``; outputs by name."""
        session = self._session("tail", cut)
        names = [o.name for o in session.get_outputs()]
        expected = session.get_inputs()[0]
        _check_features(self.name, cut, expected.shape, features)
        return dict(zip(names, session.run(None, {expected.name: features}), strict=True))

    def _session(self, part: str, cut: str) -> Any:
        key = (part, cut)
        session = self._sessions.get(key)
        if session is not None:
            return session
        if cut not in self.cuts():
            raise SplitError(f"{self.name} cannot be cut at {cut!r}",
                             hint="list the cut points with `tierlink split list MODEL`")
        with self._lock:
            if key not in self._sessions:
                self._sessions[key] = self._make(part, cut)
        return self._sessions[key]

    def _make(self, part: str, cut: str) -> Any:
        from tierlink.models.onnx import ort_session
        from tierlink.split.cache import cached_split

        tag = hashlib.sha1(f"{self.model_path}".encode()).hexdigest()[:12]
        head, tail = cached_split(self.model_path, cut, fallback_dir=self.workdir / tag)
        session = ort_session(head if part == "head" else tail, threads=1)
        _run_once(session)
        return session


def _run_once(session: Any) -> None:
    """One run on zeros (batch 1), so the first real call does not pay for the session's
    lazy initialisation: a node learns a segment's service time from its calls, and a
    first one several times slower would make the cut look slow until it ran again."""
    feed = {i.name: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in i.shape],
                             dtype=np.float32)
            for i in session.get_inputs()}
    session.run(None, feed)


def _check_features(model: str, cut: str, shape: Any, features: np.ndarray) -> None:
    """A clear error for features of the wrong rank or size, before ONNX Runtime sees them."""
    want = [d if isinstance(d, int) and d > 0 else -1 for d in shape]
    if features.dtype != np.float32 or features.ndim != len(want) or any(
            w != -1 and w != g for w, g in zip(want, features.shape, strict=True)):
        raise SplitError(f"features for {model} at {cut!r} must be FP32 of shape {want} "
                         f"(-1 = any), got {features.dtype} {list(features.shape)}")
